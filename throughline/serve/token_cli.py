"""``throughline token keygen|issue`` and the security options of ``serve`` (docs/security.md).

``token keygen --out KEYFILE [--public-out FILE]`` writes a new Ed25519 signing key (mode 0600) and
prints its key id; ``token issue --key KEYFILE (--project P ... | --project-prefix PREFIX ...) [--scope
read|metrics|admin] [--expires DURATION] [--label TEXT] [--audience NAME]`` prints a token on stdout.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from throughline.serve.exceptions import InvalidTlsOptionError
from throughline.serve.security import ENV_CA

ENV_TOKEN_KEYS = "THROUGHLINE_TOKEN_KEYS"
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


def add_security_options(p: argparse.ArgumentParser) -> None:
    """``serve``'s scoped-token and HTTPS options."""
    p.add_argument(
        "--token-keys",
        default=os.environ.get(ENV_TOKEN_KEYS) or None,
        metavar="PATH",
        help=f"accept scoped tokens signed by the key file PATH or any key file in the folder PATH (env "
        f"{ENV_TOKEN_KEYS}); re-read on SIGHUP and when a file changes. Only public keys are used",
    )
    p.add_argument(
        "--token-audience",
        default="throughline",
        metavar="NAME",
        help="the audience tokens must name (default throughline)",
    )
    p.add_argument("--tls-cert", default=None, metavar="FILE", help="serve HTTPS with this certificate chain (PEM)")
    p.add_argument("--tls-key", default=None, metavar="FILE", help="the private key of --tls-cert (PEM)")
    p.add_argument(
        "--tls-client-ca",
        default=None,
        metavar="FILE",
        help="mutual TLS: require client certificates signed by this CA (PEM)",
    )
    p.add_argument(
        "--ca",
        default=None,
        metavar="FILE",
        help=f"the CA that signs the other members' certificates, for forwarding over https (env {ENV_CA}; "
        "default the system's)",
    )
    p.add_argument(
        "--insecure-http",
        action="store_true",
        help="allow plain HTTP on a non-loopback --host (only behind a TLS-terminating proxy)",
    )


def tls_options(args: argparse.Namespace) -> Any:
    """``--tls-cert``/``--tls-key``/``--tls-client-ca``/``--ca`` as ``TlsOptions``, or ``None`` (plain HTTP)."""
    from throughline.serve.security import TlsOptions

    cert, key = args.tls_cert, args.tls_key
    if (cert is None) != (key is None):
        raise InvalidTlsOptionError("--tls-cert and --tls-key go together")
    if cert is None:
        if args.tls_client_ca is not None:
            raise InvalidTlsOptionError("--tls-client-ca needs --tls-cert and --tls-key")
        return None
    peer_ca = args.ca or os.environ.get(ENV_CA) or None
    return TlsOptions(cert=cert, key=key, client_ca=args.tls_client_ca, peer_ca=peer_ca)
