"""``python -m panqueue`` is the ``panqueue`` command."""

from panqueue.cli import main

raise SystemExit(main())
