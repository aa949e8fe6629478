"""A small Django project for tests/test_django.py: settings, one app (``shop``) with its tasks,
and a module outside every app."""
