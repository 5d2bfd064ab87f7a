"""Input and output shapes of the alerts API (docs/api.md "Alerts")."""

from rest_framework import serializers

from alerts.models import Channel, ChannelKind, Delivery, Event, Rule
from alerts.selectors import channel_target_shown


class AlertRuleInputSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=100)
    event = serializers.ChoiceField(choices=Event.choices)
    personal = serializers.BooleanField(default=False, help_text="a subscription mailed to you (members)")
    key = serializers.CharField(max_length=200, required=False, allow_blank=True)
    threshold = serializers.FloatField(required=False, allow_null=True)
    consecutive = serializers.IntegerField(required=False, min_value=1)
    stalled_minutes = serializers.FloatField(required=False, allow_null=True, min_value=0)
    quiet_minutes = serializers.FloatField(required=False, min_value=0)
    kinds = serializers.ListField(child=serializers.CharField(), required=False)
    tags = serializers.ListField(child=serializers.CharField(), required=False)
    queues = serializers.ListField(child=serializers.CharField(), required=False)
    creators = serializers.ListField(child=serializers.CharField(), required=False)
    channel_ids = serializers.ListField(child=serializers.IntegerField(), required=False)


class AlertRuleOutputSerializer(serializers.ModelSerializer):
    personal = serializers.SerializerMethodField()
    channel_ids = serializers.PrimaryKeyRelatedField(source="channels", many=True, read_only=True)

    class Meta:
        model = Rule
        fields = [
            "id",
            "name",
            "event",
            "personal",
            "key",
            "threshold",
            "consecutive",
            "stalled_minutes",
            "quiet_minutes",
            "kinds",
            "tags",
            "queues",
            "creators",
            "channel_ids",
            "enabled",
            "created_at",
        ]

    def get_personal(self, rule) -> bool:
        return rule.owner_id is not None


class AlertChannelInputSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=100)
    kind = serializers.ChoiceField(choices=ChannelKind.choices)
    target = serializers.CharField(max_length=2000, help_text="email addresses (comma-separated) or the URL")


class AlertChannelOutputSerializer(serializers.ModelSerializer):
    """A channel; its secret never (only the creation's answer carries it, once); its ``target`` whole to the
    Project's admins, a URL cut to scheme and host for others (``selectors.channel_target_shown``)."""

    failing = serializers.BooleanField(source="is_failing", read_only=True)
    target = serializers.SerializerMethodField()

    def get_target(self, channel) -> str:
        request = self.context.get("request")
        return channel_target_shown(channel, user=getattr(request, "user", None))

    class Meta:
        model = Channel
        fields = [
            "id",
            "name",
            "kind",
            "target",
            "failing",
            "last_status",
            "last_error",
            "last_delivery_at",
            "created_at",
        ]


class AlertChannelCreatedSerializer(AlertChannelOutputSerializer):
    secret = serializers.CharField(help_text="the webhook's HMAC key: shown this once")

    class Meta(AlertChannelOutputSerializer.Meta):
        fields = [*AlertChannelOutputSerializer.Meta.fields, "secret"]


class AlertDeliveryOutputSerializer(serializers.ModelSerializer):
    rule = serializers.CharField(source="firing.rule.name", default=None)
    title = serializers.CharField(source="payload.title", read_only=True)

    class Meta:
        model = Delivery
        fields = [
            "id",
            "idempotency_id",
            "rule",
            "title",
            "status",
            "attempts",
            "created_at",
            "last_attempt_at",
            "next_attempt_at",
            "delivered_at",
            "response_status",
            "error",
        ]


class RunAlertInputSerializer(serializers.Serializer):
    title = serializers.CharField(max_length=300)
    text = serializers.CharField(required=False, allow_blank=True, default="")
    level = serializers.ChoiceField(choices=["info", "warn", "error"], default="warn")


class RunAlertOutputSerializer(serializers.Serializer):
    fired = serializers.IntegerField(help_text="rules that fired with this alert")
