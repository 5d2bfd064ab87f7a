"""The browsable API (``/api/v1/`` asked for ``text/html``, as a signed-in browser does): read-only.

A module of its own, importing only DRF's renderers: DRF imports the renderer classes its settings name while
``rest_framework.views`` loads, so the module may not import the views (``mado.api`` does).
"""

from rest_framework.renderers import BrowsableAPIRenderer


class ReadOnlyBrowsableAPIRenderer(BrowsableAPIRenderer):
    """DRF's browsable API showing each answer, its links and pages, and the OPTIONS and DELETE buttons, without the
    forms DRF would build from ``view.get_serializer()`` and without inline styles (docs/deploy.md#the-browsable-api,
    docs/design/interfaces.md#page-security).

    The views read their input through input serializers of their own (``mado.api.valid``) and declare no
    ``serializer_class``, so DRF's generated POST / PUT forms and its filter form had nothing to build from and
    answered 500; writes go through the SDK, ``curl`` or Swagger UI.
    """

    def get_context(self, data, accepted_media_type, renderer_context):
        context = super().get_context(data, accepted_media_type, renderer_context)
        # DRF writes Pygments' rules into an inline <style>, which the Content-Security-Policy refuses; they style
        # Markdown code in view descriptions only, and without the markdown package there is none.
        context["code_style"] = None
        return context

    def get_rendered_html_form(self, data, view, method, request):
        if method in ("DELETE", "OPTIONS"):  # buttons only: DRF decides them from the permissions, not a serializer
            return super().get_rendered_html_form(data, view, method, request)
        return None

    def get_raw_data_form(self, data, view, method, request):
        return None

    def get_filter_form(self, data, view, request):
        return None
