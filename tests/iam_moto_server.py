"""A moto server (S3 + IAM) in its own process that can enforce IAM policies, recording each
authorization decision: ``python tests/iam_moto_server.py RECORD.jsonl``.

Why a process of its own: moto's enforcement switch (``INITIAL_NO_AUTH_ACTION_COUNT``,
reset through ``POST /moto-api/reset-auth``) is global to the process, and the suite's
other moto server runs inside pytest without it. Why record: the tests need to know which
(principal, action, resource) pairs the real processes asked for, to show that each policy
statement is used and to name what was refused.

Prints the endpoint on its first stdout line and serves until stdin closes. Requests are
served one at a time (:class:`testing.chaos.moto_server.MotoServer`), so conditional writes
are atomic as on S3.
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

AWS_ACTIONS = {
    "s3:HeadObject": "s3:GetObject",
    "s3:HeadBucket": "s3:ListBucket",
    "s3:ListObjects": "s3:ListBucket",
    "s3:ListObjectsV2": "s3:ListBucket",
    "s3:DeleteObjects": "s3:DeleteObject",
    "s3:CreateMultipartUpload": "s3:PutObject",
    "s3:UploadPart": "s3:PutObject",
    "s3:UploadPartCopy": "s3:PutObject",
    "s3:CompleteMultipartUpload": "s3:PutObject",
    "s3:ListParts": "s3:ListMultipartUploadParts",
}
"""API operations whose IAM action has another name on AWS (the S3 docs' "actions, resources
and condition keys" table): moto 5.2.6 began asking policies for the operation's name
(``s3:HeadObject``, which no policy can grant: there is no such IAM action) where 5.2.5
asked for the action AWS checks. Normalized before the check, so the policies are judged
as AWS would judge them whichever moto is installed."""


def main(record_path: str) -> None:
    # run as a script: the moto server of the chaos harness lives in testing/ (not an
    # installed package), so import it from this checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from moto.iam import access_control

    from testing.chaos.moto_server import MotoServer

    record = open(record_path, "a", buffering=1)  # noqa: SIM115 - open for the process life
    lock = threading.Lock()
    original = access_control.IAMRequestBase.check_action_permitted

    def check_and_record(self: access_control.IAMRequestBase, resource: str) -> None:
        self._action = AWS_ACTIONS.get(self._action, self._action)
        allowed = False
        try:
            original(self, resource)
            allowed = True
        finally:
            user = getattr(self._access_key, "_owner_user_name", "?")
            with lock:
                record.write(json.dumps({"user": user, "action": self._action,
                                         "resource": resource, "allowed": allowed}) + "\n")

    access_control.IAMRequestBase.check_action_permitted = check_and_record  # type: ignore
    server = MotoServer()
    print(server.endpoint, flush=True)
    sys.stdin.read()
    server.stop()


if __name__ == "__main__":
    main(sys.argv[1])
