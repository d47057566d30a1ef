#!/usr/bin/env python3
"""A real SMTP server (aiosmtpd) for the notifier's email tests.

    smtp_server.py --outdir DIR [--tls none|starttls|implicit] [--cert PEM --key PEM]
                   [--auth USER:PASSWORD]

Listens on 127.0.0.1 on a free port and prints "ready PORT" once it
accepts connections. Each message it takes is written to DIR as N.json:
{"mail_from", "rcpt_tos", "auth_user", "tls", "data"}. A recipient
starting with "reject550" is refused with 550, one starting with "busy450"
with 450, as a real server refuses an unknown or a full mailbox.
Debian: python3-aiosmtpd.
"""
import argparse
import asyncio
import json
import os
import ssl
import sys
import warnings

from aiosmtpd.smtp import SMTP, AuthResult, LoginPassword


class Handler:
    def __init__(self, outdir):
        self.outdir = outdir
        self.count = 0

    async def handle_RCPT(self, server, session, envelope, address, rcpt_options):
        if address.startswith("reject550"):
            return "550 5.1.1 No such user here"
        if address.startswith("busy450"):
            return "450 4.2.1 Mailbox busy, try again later"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server, session, envelope):
        self.count += 1
        rec = {
            "mail_from": envelope.mail_from,
            "rcpt_tos": envelope.rcpt_tos,
            "auth_user": session.auth_data.login.decode() if isinstance(session.auth_data, LoginPassword) else None,
            # session.ssl is set by STARTTLS; an implicit-TLS transport says so itself.
            "tls": session.ssl is not None or server.transport.get_extra_info("sslcontext") is not None,
            "data": envelope.original_content.decode("utf-8", "replace"),
        }
        tmp = os.path.join(self.outdir, "%d.tmp" % self.count)
        with open(tmp, "w") as f:
            json.dump(rec, f)
        os.rename(tmp, os.path.join(self.outdir, "%d.json" % self.count))
        return "250 2.0.0 Message accepted"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--outdir", required=True)
    ap.add_argument("--tls", default="none", choices=["none", "starttls", "implicit"])
    ap.add_argument("--cert")
    ap.add_argument("--key")
    ap.add_argument("--auth")
    args = ap.parse_args()

    ctx = None
    if args.tls != "none":
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(args.cert, args.key)

    # Implicit TLS is TLS from the first byte; aiosmtpd's auth_require_tls
    # only knows STARTTLS, so it is left to require it there.
    kwargs = {"hostname": "mail.test", "auth_require_tls": args.tls == "starttls"}
    if args.tls == "starttls":
        kwargs.update(tls_context=ctx, require_starttls=True)
    if args.auth:
        user, password = args.auth.split(":", 1)

        def authenticator(server, session, envelope, mechanism, auth_data):
            ok = (isinstance(auth_data, LoginPassword) and auth_data.login.decode() == user
                  and auth_data.password.decode() == password)
            return AuthResult(success=ok, handled=False, auth_data=auth_data if ok else None)

        kwargs.update(authenticator=authenticator, auth_required=True)

    warnings.filterwarnings("ignore")  # auth without STARTTLS on implicit TLS, login_data
    handler = Handler(args.outdir)
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    server = loop.run_until_complete(loop.create_server(
        lambda: SMTP(handler, loop=loop, **kwargs), "127.0.0.1", 0,
        ssl=ctx if args.tls == "implicit" else None))
    print("ready %d" % server.sockets[0].getsockname()[1], flush=True)
    try:
        loop.run_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    sys.exit(main())
