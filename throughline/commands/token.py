"""``throughline token keygen|issue`` (docs/security.md).

``token keygen --out KEYFILE [--public-out FILE]`` writes a new Ed25519 signing key (mode 0600) and
prints its key id; ``token issue --key KEYFILE (--project P ... | --project-prefix PREFIX ...) [--scope
read|metrics|admin] [--expires DURATION] [--label TEXT] [--audience NAME]`` prints a token on stdout.
"""

from __future__ import annotations

import argparse
from typing import Any

DEFAULT_EXPIRES = "30d"


def register(subparsers: Any) -> None:
    """Add the ``token`` subcommand (``keygen``, ``issue``)."""
    p = subparsers.add_parser(
        "token",
        help="make signing keys and scoped read tokens for `serve --token-keys`",
        description="Signing keys and scoped, signed bearer tokens for `throughline serve` (docs/security.md).",
    )
    sub = p.add_subparsers(dest="token_command", metavar="ACTION", required=True)
    keygen = sub.add_parser("keygen", help="write a new signing key and print its key id")
    keygen.add_argument("--out", required=True, metavar="KEYFILE", help="the key file to create (never overwritten)")
    keygen.add_argument(
        "--public-out",
        default=None,
        metavar="FILE",
        help="also write the public key alone: what `serve --token-keys` needs (it cannot issue tokens)",
    )
    keygen.set_defaults(func=_cmd_keygen)
    issue = sub.add_parser("issue", help="print a signed token on stdout")
    issue.add_argument("--key", required=True, metavar="KEYFILE", help="the signing key (`token keygen`'s file)")
    issue.add_argument("--project", action="append", default=[], metavar="P", help="a project the token reads (repeat)")
    issue.add_argument(
        "--project-prefix",
        action="append",
        default=[],
        metavar="PREFIX",
        help="every project whose name starts with PREFIX (repeat; end it with the separator, e.g. /srv/team-a/)",
    )
    issue.add_argument(
        "--scope",
        choices=("read", "metrics", "admin"),
        default="read",
        help="read: the projects named; metrics: /metrics only; admin: everything (default read)",
    )
    issue.add_argument(
        "--expires",
        default=DEFAULT_EXPIRES,
        metavar="DURATION",
        help=f"e.g. 3600s, 90m, 12h, 30d (default {DEFAULT_EXPIRES})",
    )
    issue.add_argument("--label", default=None, metavar="TEXT", help="who or what the token is for (in the token)")
    issue.add_argument(
        "--audience",
        default=None,
        metavar="NAME",
        help="the deployment it is for (default throughline; serve --token-audience)",
    )
    issue.set_defaults(func=_cmd_issue)


def _cmd_keygen(args: argparse.Namespace) -> int:
    from throughline.serve.tokens import generate_key_file

    print(generate_key_file(args.out, public_out=args.public_out), flush=True)
    return 0


def _cmd_issue(args: argparse.Namespace) -> int:
    from throughline.serve.tokens import DEFAULT_AUDIENCE, issue_token, load_signing_key, parse_duration

    expires = parse_duration(args.expires)
    key = load_signing_key(args.key)
    token = issue_token(
        key,
        projects=args.project,
        prefixes=args.project_prefix,
        scope=args.scope,
        expires_in=expires,
        audience=args.audience or DEFAULT_AUDIENCE,
        label=args.label,
    )
    print(token, flush=True)
    return 0
