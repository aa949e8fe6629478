"""Handlers for examples/permissions.py (a module, not an example: it is not run).

The handler runs in a child process confined by the kernel to its ``Permissions``: it reads
images from the input directory, writes thumbnails to the output directory, and uploads them
over HTTPS to one host and port; anything else fails inside it. Where the directories and the
upload server are comes from the environment (``THUMBS_*``), which the example sets before it
imports this module. The child imports this module too (before it is confined), and inherits
exactly the variables that ``env=`` names, so both sides register the same grants.
"""

from __future__ import annotations

import json
import os
import socket
import ssl
import urllib.request
from pathlib import Path

from PIL import Image

from panqueue import Job, Permissions, Registry

INPUT = os.environ["THUMBS_INPUT"]          # read: the images
OUTPUT = os.environ["THUMBS_OUTPUT"]        # write: the thumbnails
CA_DIR = os.environ["THUMBS_CA_DIR"]        # read: the upload server's CA certificate
UPLOAD = os.environ["THUMBS_UPLOAD"]        # net: localhost:<port>, the HTTPS upload server

queues = Registry()


@queues.handler("thumbnails", executor="subprocess", concurrency=2,
                permissions=Permissions(read=[INPUT, CA_DIR], write=[OUTPUT], net=[UPLOAD],
                                        env=["THUMBS_*"]))
def thumbnail(job: Job) -> dict[str, object]:
    task = job.data.get("task", "thumbnail")
    if task == "read":       # a path outside the grants: the kernel refuses it
        return {"read": Path(job.data["path"]).read_text()}
    if task == "connect":    # an address outside the grants (the worker's Redis)
        with socket.create_connection((job.data["host"], job.data["port"]), timeout=5):
            return {"connected": True}
    name = job.data["image"]
    with Image.open(Path(INPUT) / name) as image:
        image.thumbnail((128, 128))
        size = image.size
        target = Path(OUTPUT) / f"{Path(name).stem}-thumb.png"
        image.save(target)
    job.progress(50)
    context = ssl.create_default_context(cafile=str(Path(CA_DIR) / "ca.pem"))
    request = urllib.request.Request(f"https://{UPLOAD}/thumbs/{target.name}",
                                     data=target.read_bytes(), method="PUT",
                                     headers={"Content-Type": "image/png"})
    with urllib.request.urlopen(request, context=context, timeout=10) as response:
        stored = json.load(response)
    return {"thumbnail": target.name, "size": f"{size[0]}x{size[1]}", "uploaded": stored}
