"""`unicode-normalizer`: NFKC-normalizes user input, optionally strips control characters,
collapses whitespace and trims."""

from __future__ import annotations

import logging
import re
import unicodedata

from pydantic import BaseModel

from procmesh import Processor
from procmesh_sidecars.builtins._common import Message, map_message_text

log = logging.getLogger(__name__)

_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
# Everything but tab, newline, carriage return, printable ASCII and U+00A0 and up. The reference
# works on UTF-16 code units, where astral characters (emoji) are surrogates inside its range, so
# code points from U+10000 up are kept here too.
_NON_PRINTABLE = re.compile("[^\t\n\r\x20-\x7e\u00a0-\U0010ffff]")


class UnicodeNormalizerOptions(BaseModel):
    """Options of `unicode-normalizer`."""

    strip_control_chars: bool = False
    """Remove control characters."""
    preserve_emojis: bool = True
    """With strip_control_chars: remove only C0/C1 controls (else everything non-printable). The
    reference's option: its two patterns match the same characters (emoji survive the second, whose
    range keeps their UTF-16 surrogates), and so do `_CONTROL` and `_NON_PRINTABLE` here."""
    collapse_whitespace: bool = True
    """CRLF/CR to LF, runs of newlines to one, runs of spaces/tabs to one space."""
    trim: bool = True
    """Strip leading and trailing whitespace."""


def normalize_text(text: str, options: UnicodeNormalizerOptions) -> str:
    """The normalizer's transformation of one string."""
    out = unicodedata.normalize("NFKC", text)
    if options.strip_control_chars:
        out = (_CONTROL if options.preserve_emojis else _NON_PRINTABLE).sub("", out)
    if options.collapse_whitespace:
        out = re.sub(r"\r\n|\r", "\n", out)
        out = re.sub(r"\n+", "\n", out)
        out = re.sub(r"[ \t]+", " ", out)
    if options.trim:
        out = out.strip()
    return out


class UnicodeNormalizer(Processor):
    """Normalizes the text of the new input messages (every text part)."""

    id = "unicode-normalizer"
    name = "Unicode Normalizer"
    description = "NFKC-normalizes input text; optional control-character stripping; whitespace cleanup."
    Options = UnicodeNormalizerOptions

    async def process_input(
        self, messages: list[Message], options: UnicodeNormalizerOptions
    ) -> list[Message] | None:
        try:
            out = [map_message_text(m, lambda t: normalize_text(t, options)) for m in messages]
        except Exception:  # the reference passes input through unchanged on any failure
            log.exception("unicode-normalizer failed; input passed through unchanged")
            return None
        return out if out != messages else None
