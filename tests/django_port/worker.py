"""The workers of the ported suites: they run the tasks of the ``port`` backend from the queue
``port`` (``panqueue worker tests.django_port.worker:registry``)."""

from panqueue.django import registry_for

registry = registry_for("port", queues=["port"])
