"""A minimal Django project whose tasks run on panqueue (see examples/django_tasks_app.py)."""
