"""Outgoing e-mail over SMTP (host, port, credentials, TLS from the settings).  In development mode
(GATEWAY_DEV=1) without GATEWAY_SMTP_HOST the messages go to the local capture server that the
launcher starts; outside it the console does not start without an SMTP server.  Nothing here logs a
message's body (it holds single-use links)."""
from __future__ import annotations

import asyncio
import datetime as dt
import logging
import smtplib
import ssl
from email.message import EmailMessage

from .i18n import _, money, money_exact, when
from .settings import ConsoleSettings

log = logging.getLogger("console.mail")


class Mailer:
    def __init__(self, s: ConsoleSettings) -> None:
        self.capture = s.dev and not s.smtp_host
        self.host = s.smtp_host or "127.0.0.1"
        self.port = s.smtp_port or (s.smtp_capture_port if self.capture else (465 if s.smtp_tls == "tls" else 587))
        self.tls = "none" if self.capture else s.smtp_tls
        self.user, self.password = s.smtp_user, s.smtp_password
        self.sender = s.mail_from

    def _send(self, msg: EmailMessage) -> None:
        ctx = ssl.create_default_context()
        if self.tls == "tls":
            smtp: smtplib.SMTP = smtplib.SMTP_SSL(self.host, self.port, timeout=20, context=ctx)
        else:
            smtp = smtplib.SMTP(self.host, self.port, timeout=20)
        with smtp:
            if self.tls == "starttls":
                smtp.starttls(context=ctx)
            if self.user:
                smtp.login(self.user, self.password)
            smtp.send_message(msg)

    async def send(self, to: str, subject: str, text: str,
                   attachment: tuple[str, str, bytes] | None = None) -> bool:
        """``attachment``: (file name, media type, bytes)."""
        try:
            msg = EmailMessage()
            msg["From"], msg["To"], msg["Subject"] = self.sender, to, subject
            msg.set_content(text)
            if attachment is not None:
                name, media, data = attachment
                main, sub = media.split("/", 1)
                msg.add_attachment(data, maintype=main, subtype=sub, filename=name)
        except ValueError:  # a header that would carry a line break: never sent (the forms refuse it first)
            log.warning("refused to send %r: invalid header", subject.split(" ", 1)[0])
            return False
        try:
            await asyncio.to_thread(self._send, msg)
            return True
        except (OSError, smtplib.SMTPException) as e:
            log.warning("could not send %r: %s", subject, type(e).__name__)
            return False


# ---- the messages (in the language of the request, or of ``i18n.speaking``) ---------------------

def confirm(link: str) -> tuple[str, str]:
    return (_("Confirm your e-mail address"),
            _("Welcome!\n\nConfirm your e-mail address to activate your account and receive the trial balance:\n\n"
              "{link}\n\nThe link works once and expires in 24 hours. If you did not sign up, ignore this message.\n")
            .format(link=link))


def already_registered(link: str) -> tuple[str, str]:
    return (_("Your account already exists"),
            _("Someone (probably you) tried to sign up with this address, which already has an account.\n\n"
              "Log in or reset your password here:\n\n{link}\n").format(link=link))


def reset(link: str) -> tuple[str, str]:
    return (_("Reset your password"),
            _("Set a new password here:\n\n{link}\n\nThe link works once and expires in 1 hour."
              " If you did not ask for it, ignore this message.\n").format(link=link))


def invite(org_name: str, inviter: str, link: str) -> tuple[str, str]:
    return (_("Invitation to {org}").format(org=org_name),
            _("{inviter} invites you to the organisation \"{org}\" on the gateway console.\n\n"
              "Accept here:\n\n{link}\n\nThe invitation expires in 7 days.\n")
            .format(inviter=inviter, org=org_name, link=link))


def low_balance(org_name: str, balance_micro: int, threshold_micro: int, link: str) -> tuple[str, str]:
    return (_("Low balance: {org}").format(org=org_name),
            _("The prepaid balance of \"{org}\" is {balance}, under the {threshold} you set.\n\n"
              "When it reaches zero the API answers 402 until it is topped up. Top up here:\n\n{link}\n\n"
              "This message is sent once each time the balance falls under the threshold.\n")
            .format(org=org_name, balance=money(balance_micro), threshold=money(threshold_micro), link=link))


def key_near_limit(org_name: str, key_name: str, spent_micro: int, limit_micro: int, link: str) -> tuple[str, str]:
    return (_("API key near its monthly limit: {key}").format(key=key_name),
            _("The API key \"{key}\" of \"{org}\" has spent {spent} this month, of its monthly limit of {limit}.\n\n"
              "When it reaches the limit the API answers its requests with 402 until the next month (Polish time)"
              " or until an owner raises the limit here:\n\n{link}\n\n"
              "This message is sent once a month for each key.\n")
            .format(key=key_name, org=org_name, spent=money_exact(spent_micro), limit=money(limit_micro), link=link))


def paid(amount_micro: int, number: str, link: str) -> tuple[str, str]:
    amount = money(amount_micro)
    return (_("Payment received: {amount}").format(amount=amount),
            _("Thank you: {amount} is credited to your prepaid balance.\n\nThe VAT invoice {number} is attached;"
              " it is also on the Billing page:\n\n{link}\n").format(amount=amount, number=number, link=link))


def model_change(alias: str, effective: dt.datetime, before: str, after: str, link: str) -> tuple[str, str]:
    """A change of the upstream models behind an alias, announced ahead (``before``/``after``: the models
    with their traffic shares)."""
    return (_("Model change behind {alias} from {when}").format(alias=alias, when=when(effective)),
            _("From {when}, requests to the model \"{alias}\" go to: {after} (until then: {before}).\n\n"
              "The model name in your requests and in the replies stays \"{alias}\", and its context and"
              " output limits stay the same or grow. The change applies to requests that start from that"
              " time on.\n\nEvery change of prices and models is listed here:\n\n{link}\n")
            .format(alias=alias, when=when(effective), before=before, after=after, link=link))
