"""Permissions: a real handler that the kernel holds to exactly what it was granted.

The handler (in examples/_permission_handlers.py) runs in a child process under
``Permissions(read=[images, CA dir], write=[thumbnails], net=["localhost:<port>"],
env=["THUMBS_*"])``: it opens an image with Pillow, writes a thumbnail, and uploads it with
``urllib.request`` over HTTPS to an upload server this example starts (a certificate made now,
trusted by the child through a CA file in a granted directory). Python, the standard library,
Pillow, the resolver configuration and the CA store are usable without grants. The same
handler then tries to read the upload server's private key and to connect to Redis: the kernel
refuses both, the jobs fail with PermissionError, and the worker keeps serving.

Linux only, with Landlock (ABI 6 or later) and seccomp user notification; the example first runs
``panqueue check-permissions`` and stops there if this host cannot enforce the grants. The
certificate is made with the ``cryptography`` package if it is installed, else with ``openssl``.

    PANQUEUE_URL=redis://127.0.0.1:6390/0 python examples/permissions.py

Without PANQUEUE_URL the example starts a private Redis-compatible server and stops it at the end.
"""

from __future__ import annotations

import datetime as dt
import http.server
import ipaddress
import json
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from urllib.parse import urlsplit

import anyio
from PIL import Image

from panqueue import JobFailed, QueueClient, Worker, configure_logging
from panqueue.embedded import url_or_private_server

EXAMPLES = Path(__file__).resolve().parent


def make_certificate(ca_dir: Path, private: Path) -> str:
    """A CA (its certificate in ``ca_dir``, which the child may read) and a certificate for
    localhost signed by it (key and certificate in ``private``, which it may not)."""
    try:
        import cryptography  # noqa: F401
    except ImportError:
        return _make_certificate_openssl(ca_dir, private)
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "panqueue example CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - dt.timedelta(minutes=5))
          .not_valid_after(now + dt.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False,
                                       key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, key_cert_sign=True, crl_sign=True,
                                       encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()),
                         critical=False)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
            .issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([
                x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                x509.IPAddress(ipaddress.ip_address("::1"))]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([x509.ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    (ca_dir / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (private / "server.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (private / "server.key").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    return "cryptography"


def _make_certificate_openssl(ca_dir: Path, private: Path) -> str:
    openssl = shutil.which("openssl")
    if openssl is None:
        sys.exit("this example needs the cryptography package or the openssl command")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    ca_key = private / "ca.key"
    (private / "server.ext").write_text(
        "subjectAltName=DNS:localhost,IP:127.0.0.1,IP:::1\n"
        "basicConstraints=critical,CA:FALSE\nextendedKeyUsage=serverAuth\n")
    for args in (
        ["req", "-x509", *ec, "-keyout", ca_key, "-out", ca_dir / "ca.pem", "-days", "1",
         "-subj", "/CN=panqueue example CA",
         "-addext", "basicConstraints=critical,CA:TRUE,pathlen:0",
         "-addext", "keyUsage=critical,keyCertSign,cRLSign"],
        ["req", *ec, "-keyout", private / "server.key", "-out", private / "server.csr",
         "-subj", "/CN=localhost"],
        ["x509", "-req", "-in", private / "server.csr", "-CA", ca_dir / "ca.pem",
         "-CAkey", ca_key, "-set_serial", "2", "-days", "1", "-out", private / "server.pem",
         "-extfile", private / "server.ext"],
    ):
        subprocess.run([openssl, *map(str, args)], check=True, capture_output=True)
    return "openssl"


class UploadServer(http.server.ThreadingHTTPServer):
    """HTTPS on 127.0.0.1: PUT /thumbs/NAME stores the body in memory and answers JSON."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), UploadHandler)
        self.received: dict[str, int] = {}


class UploadHandler(http.server.BaseHTTPRequestHandler):
    server: UploadServer

    def do_PUT(self) -> None:
        name = self.path.rsplit("/", 1)[-1]
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.received[name] = len(body)
        answer = json.dumps({"stored": name, "bytes": len(body)}).encode()
        self.send_response(201)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, format: str, *args: object) -> None:
        pass  # quiet


def make_images(directory: Path) -> list[str]:
    names = []
    for name, size, colour in (("beach.jpg", (1024, 768), (30, 144, 255)),
                               ("tower.png", (400, 1200), (200, 60, 40)),
                               ("square.jpg", (512, 512), (40, 160, 80))):
        Image.new("RGB", size, colour).save(directory / name)
        names.append(name)
    return names


async def main(url: str, root: Path, private: Path, upload: UploadServer) -> None:
    from _permission_handlers import queues, thumbnail

    images = make_images(Path(os.environ["THUMBS_INPUT"]))
    worker = Worker(queues, "thumbnails", url=url)
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run)
        print(f"worker started (handler {thumbnail.import_path}, in confined children)")
        async with QueueClient(url) as client:
            thumbs = client.queue("thumbnails")
            handles = [await thumbs.add({"image": name}) for name in images]
            for name, handle in zip(images, handles, strict=True):
                done = await handle.result(timeout=60.0)
                print(f"{name}: {done['size']} thumbnail {done['thumbnail']}, uploaded as "
                      f"{done['uploaded']['stored']} ({done['uploaded']['bytes']} bytes)")
            print(f"the upload server received {len(upload.received)} thumbnails: "
                  f"{sorted(upload.received)}")
            print(f"thumbnails on disk: {sorted(p.name for p in (root / 'out').iterdir())}")

            redis_url = urlsplit(url)
            for what, data in (
                ("read the upload server's private key",
                 {"task": "read", "path": str(private / "server.key")}),
                ("connect to the worker's Redis",
                 {"task": "connect", "host": redis_url.hostname, "port": redis_url.port}),
            ):
                try:
                    await (await thumbs.add(data, attempts=1)).result(timeout=60.0)
                    print(f"{what}: it worked (it should not have)")
                except JobFailed as exc:
                    assert exc.error is not None
                    print(f"{what}: failed: {exc.error.type}: {exc.error.message}")

            again = await (await thumbs.add({"image": images[0]})).result(timeout=60.0)
            print(f"the worker keeps serving: {images[0]} again, uploaded as "
                  f"{again['uploaded']['stored']}")
        await worker.shutdown(grace=5.0)
    print(f"worker stopped: {worker.processed} completed, {worker.failed} failed")


def check_host() -> bool:
    """``panqueue check-permissions``: does this host enforce the handler's grants?"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(EXAMPLES), *filter(None, [os.environ.get("PYTHONPATH")])])}
    proc = subprocess.run([sys.executable, "-m", "panqueue", "check-permissions",
                           "_permission_handlers:queues"], capture_output=True, text=True,
                          env=env, cwd=EXAMPLES, check=False)
    if proc.returncode == 2:
        sys.exit(proc.stderr.strip())
    verdict = proc.stdout.strip().splitlines()[-1].strip()
    print(f"panqueue check-permissions _permission_handlers:queues: {verdict}")
    return proc.returncode == 0


def run() -> None:
    root = Path(tempfile.mkdtemp(prefix="panqueue-thumbs-"))
    private = root / "private"      # the upload server's key: granted to nobody
    for sub in ("in", "out", "ca", "private"):
        (root / sub).mkdir()
    maker = make_certificate(root / "ca", private)
    upload = UploadServer()
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_context.load_cert_chain(private / "server.pem", private / "server.key")
    upload.socket = server_context.wrap_socket(upload.socket, server_side=True)
    port = upload.server_address[1]
    print(f"upload server on https://localhost:{port} (certificate made with {maker})")
    # What the handler module reads; the child inherits these through env=["THUMBS_*"].
    os.environ.update(THUMBS_INPUT=str(root / "in"), THUMBS_OUTPUT=str(root / "out"),
                      THUMBS_CA_DIR=str(root / "ca"), THUMBS_UPLOAD=f"localhost:{port}")
    serving = threading.Thread(target=upload.serve_forever, daemon=True)
    serving.start()
    try:
        if check_host():
            with url_or_private_server() as url:
                anyio.run(main, url, root, private, upload)
        else:
            print("this host cannot enforce the grants: the worker would refuse the queue")
    finally:
        upload.shutdown()
        upload.server_close()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    # Errors only: the two refused jobs are logged by the worker as errors on stderr.
    configure_logging(level="error")
    run()
    print("done")
