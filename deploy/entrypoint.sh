#!/bin/sh
# The image's one entry point (docs/deploy.md#images). Each sub-command execs its process, so it receives the
# container's SIGTERM (through tini) and shuts down as docs/deploy.md#graceful-shutdown says.
#   web [gunicorn options]           gunicorn on $MADO_BIND (default 0.0.0.0:8000)
#   worker --queues Q[,Q] [options]  a Celery worker running one Job at a time on those queues
#   beat [options]                   the periodic checks (exactly one per deployment)
#   migrate | createsuperuser [...]  manage.py's commands
#   demo [options]                   the one-machine demo (worker image): a Job fails at step 27 and is resumed
#   manage <command> [...]           any other manage.py command
set -e
command=${1:-web}
[ $# -gt 0 ] && shift
# The role, for the settings: web, worker, beat and migrate refuse to start without MADO_SECRET_KEY
# (mado/checks.py, docs/deploy.md#secret-key); the demo and manage.py's other commands run without it.
export MADO_ROLE="$command"
case "$command" in
  web)
    # gunicorn's processes share their counters for /metrics through this folder, emptied at each start.
    export PROMETHEUS_MULTIPROC_DIR="${PROMETHEUS_MULTIPROC_DIR:-/tmp/mado-metrics}"
    rm -rf "$PROMETHEUS_MULTIPROC_DIR" && mkdir -p "$PROMETHEUS_MULTIPROC_DIR"
    if [ "${MADO_LOG_FORMAT:-text}" = json ]; then
      # gunicorn's own lines (start, workers, errors) as JSON objects too; the file is read from the working
      # directory (/app in the image).
      set -- --log-config-json deploy/gunicorn-logging.json --access-logformat \
        '{"time": "%(t)s", "level": "INFO", "logger": "gunicorn.access", "message": "%(r)s", "status": %(s)s, "bytes": "%(B)s", "duration_us": %(D)s, "remote": "%(h)s", "request_id": "%({x-request-id}o)s"}' \
        "$@"
    fi
    exec gunicorn config.wsgi:application --bind "${MADO_BIND:-0.0.0.0:8000}" --worker-class gthread \
      --workers "${MADO_WEB_WORKERS:-2}" --threads "${MADO_WEB_THREADS:-4}" \
      --graceful-timeout "${MADO_WEB_GRACEFUL_TIMEOUT:-30}" --access-logfile - "$@" ;;
  worker)
    case " $* " in *" --queues "* | *" -Q "* | *" --queues="*) ;; *) echo "worker needs --queues Q[,Q]" >&2; exit 2 ;; esac
    exec celery -A config worker --concurrency 1 --pool solo --hostname "${MADO_WORKER_NAME:-worker}@%h" \
      --without-gossip --without-mingle --loglevel "${MADO_LOG_LEVEL:-INFO}" "$@" ;;
  beat)
    exec celery -A config beat --schedule "${MADO_DATA_DIR:-/var/lib/mado}/celerybeat-schedule" \
      --loglevel "${MADO_LOG_LEVEL:-INFO}" "$@" ;;
  migrate) exec python3 manage.py migrate --noinput "$@" ;;
  createsuperuser) exec python3 manage.py createsuperuser "$@" ;;
  demo) exec python3 manage.py demo --host "${MADO_DEMO_HOST:-0.0.0.0}" "$@" ;;
  manage) exec python3 manage.py "$@" ;;
  *) echo "unknown sub-command '$command': web, worker --queues Q, beat, migrate, createsuperuser, demo, manage" >&2
     exit 2 ;;
esac
