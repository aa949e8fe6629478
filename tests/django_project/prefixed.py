"""The worker registry of the ``billing`` backend, whose queues are under the key prefix
``billing`` (``panqueue worker tests.django_project.prefixed:registry``, no ``--prefix``)."""

from panqueue.django import registry_for

registry = registry_for("billing")
