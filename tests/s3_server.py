"""An S3-protocol server on 127.0.0.1 for tests: moto's ThreadedMotoServer, with authentication.

`S3Server.start()` runs moto in this process, creates an IAM user with an access key allowed
everything, a bucket, and then turns request signing checks on (moto's `/moto-api/reset-auth`),
so a wrong secret gets SignatureDoesNotMatch as from AWS; `stop()` turns them off again (the
switch is the process's, shared with any other moto server a test starts in it). Moto 5.2.5 enforces `If-None-Match: *`
and `If-Match` on PutObject, CompleteMultipartUpload and DeleteObject (412 PreconditionFailed).
`env()` is what a process needs to reach it: the endpoint (AWS_ENDPOINT_URL_S3), the key and
the region, the standard variables botocore reads. `stop()` stops the server.

`PlainS3Server` is moto in a process of its own (moto's state and its authentication switch
are per process), without authentication: `StrippingProxy` forwards to it and drops
`If-None-Match` and `If-Match` on the way, a store that accepts conditional writes and ignores
them.
"""

from __future__ import annotations

import http.client
import json
import logging
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

BUCKET = "gristmill-test"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class S3Server:
    endpoint: str
    key_id: str
    secret: str
    server: object

    @classmethod
    def start(cls, auth: bool = True, bucket: str = BUCKET) -> S3Server:
        import boto3
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
        port = _free_port()
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
        server.start()
        endpoint = f"http://127.0.0.1:{port}"
        anyone = {"endpoint_url": endpoint, "aws_access_key_id": "setup", "aws_secret_access_key": "setup"}
        iam = boto3.client("iam", region_name="us-east-1", **anyone)
        user = f"gristmill-{port}"  # moto's state is the process's: another server's user may exist
        iam.create_user(UserName=user)
        policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
        arn = iam.create_policy(PolicyName=f"everything-{port}", PolicyDocument=json.dumps(policy))["Policy"]["Arn"]
        iam.attach_user_policy(UserName=user, PolicyArn=arn)
        key = iam.create_access_key(UserName=user)["AccessKey"]
        boto3.client("s3", region_name="us-east-1", **anyone).create_bucket(Bucket=bucket)
        if auth:  # from now on every request must be signed with the key above
            _reset_auth(endpoint, b"0")
        return cls(endpoint, key["AccessKeyId"], key["SecretAccessKey"], server)

    def env(self, endpoint: str | None = None) -> dict[str, str]:
        return {
            "AWS_ENDPOINT_URL_S3": endpoint or self.endpoint,
            "AWS_ACCESS_KEY_ID": self.key_id,
            "AWS_SECRET_ACCESS_KEY": self.secret,
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",  # no instance-role lookup on a machine that is no EC2 instance
        }

    def client(self):
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=self.key_id,
            aws_secret_access_key=self.secret,
            region_name="us-east-1",
        )

    def stop(self) -> None:
        # moto's authentication switch is the process's: off again, for the servers of other tests
        _reset_auth(self.endpoint, b"inf")
        self.server.stop()


def _reset_auth(endpoint: str, count: bytes) -> None:
    """moto's `reset-auth`: requests are signed-checked after `count` more (inf: never)."""
    req = urllib.request.Request(
        f"{endpoint}/moto-api/reset-auth", data=count, method="POST", headers={"Content-Type": "text/plain"}
    )
    urllib.request.urlopen(req, timeout=30).read()


class PlainS3Server:
    """moto's server in a child process, any credentials accepted, with one bucket."""

    def __init__(self, bucket: str = BUCKET):
        import boto3

        port = _free_port()
        self.endpoint = f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.time() + 60
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if time.time() > deadline or self.proc.poll() is not None:
                    self.stop()
                    raise RuntimeError(f"moto.server did not start on port {port}") from None
                time.sleep(0.2)
        self.secret = "any"
        anyone = {"aws_access_key_id": "any", "aws_secret_access_key": "any", "region_name": "us-east-1"}
        self.client = boto3.client("s3", endpoint_url=self.endpoint, **anyone)
        self.client.create_bucket(Bucket=bucket)

    def env(self, endpoint: str | None = None) -> dict[str, str]:
        return {
            "AWS_ENDPOINT_URL_S3": endpoint or self.endpoint,
            "AWS_ACCESS_KEY_ID": "any",
            "AWS_SECRET_ACCESS_KEY": "any",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def stop(self) -> None:  # the child we started, by its pid
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class _Forward(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _forward(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("if-none-match", "if-match", "host")}
        conn = http.client.HTTPConnection("127.0.0.1", self.server.target_port, timeout=60)
        conn.request(self.command, self.path, body=body, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        self.send_response(resp.status)
        head = self.command == "HEAD"  # its Content-Length is the object's, with no body
        for k, v in resp.getheaders():
            if k.lower() not in ("transfer-encoding", "connection") and (head or k.lower() != "content-length"):
                self.send_header(k, v)
        if not head:
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        conn.close()

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward  # noqa: N815 (http.server's names)


class StrippingProxy:
    """A store that ignores conditional writes: forwards to `target` (without authentication,
    since the dropped headers are signed) without If-None-Match and If-Match."""

    def __init__(self, target: PlainS3Server):
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Forward)
        self.httpd.target_port = int(target.endpoint.rsplit(":", 1)[1])
        self.endpoint = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
