"""The worker registry of the ``anyqueue`` backend (``QUEUES: []``): its workers serve the
queues named here (``panqueue worker tests.django_project.any_queue:registry``)."""

from panqueue.django import registry_for

registry = registry_for("anyqueue", queues=["anything", "reports-2"])
