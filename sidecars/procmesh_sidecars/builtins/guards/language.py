"""`language-detector`: a judge model names the input's language; the guard records it, translates,
blocks or warns (the reference's LanguageDetector; input lane only, as there).

Each input message of at least `min_text_length` characters is judged. A detection below
`threshold` leaves the message untouched; one in a target language (or none) marks the message
``content.metadata.language_detection`` as the target language; any other language is handled by
`strategy`: ``detect`` records it, ``warn`` records it and reports a violation, ``translate``
replaces the text with the judge's translation into the first target language (the original kept
in the metadata with `preserve_original`), ``block`` aborts.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from procmesh_sidecars.builtins.guards._judge import (
    GuardOptions,
    InputHook,
    Phase,
    Question,
    ask,
    nullable,
    verdict_object,
)
from procmesh_sidecars.builtins.guards._verdicts import Verdict

LANGUAGES = {
    "en": "English",
    "es": "Spanish",
    "fr": "French",
    "de": "German",
    "it": "Italian",
    "pt": "Portuguese",
    "ru": "Russian",
    "ja": "Japanese",
    "ko": "Korean",
    "zh": "Chinese",
    "zh-cn": "Chinese (Simplified)",
    "zh-tw": "Chinese (Traditional)",
    "ar": "Arabic",
    "hi": "Hindi",
    "th": "Thai",
    "vi": "Vietnamese",
    "tr": "Turkish",
    "pl": "Polish",
    "nl": "Dutch",
    "sv": "Swedish",
    "da": "Danish",
    "no": "Norwegian",
    "fi": "Finnish",
    "el": "Greek",
    "he": "Hebrew",
    "cs": "Czech",
    "hu": "Hungarian",
    "ro": "Romanian",
    "bg": "Bulgarian",
    "hr": "Croatian",
    "sk": "Slovak",
    "sl": "Slovenian",
    "et": "Estonian",
    "lv": "Latvian",
    "lt": "Lithuanian",
    "uk": "Ukrainian",
    "be": "Belarusian",
}
"""ISO 639-1 codes and the names the reference knows (a target may be given either way)."""


class LanguageOptions(GuardOptions):
    """Options of `language-detector`."""

    target_languages: list[str] = Field(default_factory=lambda: ["English", "en"], min_length=1)
    """Names or ISO codes; the first is what ``translate`` translates into."""
    threshold: float = Field(default=0.7, ge=0, le=1)
    """A detection less confident than this leaves the message untouched."""
    strategy: Literal["detect", "translate", "block", "warn"] = "detect"
    preserve_original: bool = True
    """With ``translate``: keep the original text in the message's metadata."""
    min_text_length: int = Field(default=10, ge=0)
    """Shorter messages are not judged (too little text to tell a language)."""
    include_detection_details: bool = False
    """Put the detection in the violation message too (the detail always has it)."""
    translation_quality: Literal["speed", "quality", "balanced"] | None = None
    """Accepted and ignored, as in the reference (deprecated there)."""


def code_of(language: str) -> str:
    """A language name or code as an ISO code (``French`` -> ``fr``)."""
    lower = language.lower()
    if lower in LANGUAGES:
        return lower
    for code, name in LANGUAGES.items():
        if name.lower() == lower:
            return code
    return lower if len(lower) <= 3 else "unknown"


def name_of(code: str) -> str:
    """An ISO code's language name (the code itself when unknown)."""
    return LANGUAGES.get(code.lower(), code)


def is_target(code: str | None, targets: list[str]) -> bool:
    """Whether `code` is one of `targets` (no detection counts as the target)."""
    if not code:
        return True
    return any(code_of(t) == code.lower() or t.lower() == name_of(code).lower() for t in targets)


_INSTRUCTIONS = (
    "You identify the language a text is written in, and translate it when asked. Give the ISO "
    "639-1 code and your confidence from 0 to 1."
)


def _schema(translate: bool) -> dict[str, Any]:
    properties: dict[str, Any] = {
        "iso_code": nullable({"type": "string"}),
        "confidence": nullable({"type": "number", "minimum": 0, "maximum": 1}),
    }
    if translate:
        properties["translated_text"] = nullable({"type": "string"})
    return verdict_object(properties)


class LanguageDetector(InputHook):
    """Detects the input's language and records, translates, blocks or warns."""

    id = "language-detector"
    name = "Language Detector"
    description = "A judge model detects the input's language (detect, translate, block, warn)."
    Options = LanguageOptions

    def min_length(self, options: LanguageOptions) -> int:
        """Texts shorter than `min_text_length` are not judged."""
        return max(options.min_text_length, 1)

    def _record(
        self, options: LanguageOptions, code: str | None, confidence: float | None, **extra: Any
    ) -> dict[str, Any]:
        record: dict[str, Any] = {}
        if code:
            record |= {"detected_language": name_of(code), "iso_code": code}
        if confidence:
            record["confidence"] = confidence
        record |= {"is_target_language": is_target(code, options.target_languages)}
        record |= {"target_languages": options.target_languages, **extra}
        return {"language_detection": record}

    async def verdict(self, text: str, options: LanguageOptions, model: Any, phase: Phase) -> Verdict:
        """Name `text`'s language and apply the strategy to a non-target one."""
        translate = options.strategy == "translate"
        target = options.target_languages[0]
        targets = f"\n\nTarget: {'/'.join(options.target_languages)}"
        if translate:
            targets += f". If it is not in {target}, translate it into {target} (translated_text)."
        prompt = f'Detect the language of: "{text}"{targets}'
        question = Question(text, phase, f"Detect the language of the content.{targets}")
        instructions = options.instructions or _INSTRUCTIONS
        answer = await ask(model, options, instructions, prompt, _schema(translate), question)
        code = answer.get("iso_code") or None
        confidence = answer.get("confidence")
        translated = answer.get("translated_text") if translate else None
        if translated and not confidence:
            confidence = 0.95  # a translation is a confident detection (as the reference assumes)
        if confidence is not None and confidence < options.threshold:
            return Verdict("pass")
        if not code or not confidence or is_target(code, options.target_languages):
            # no language, or one named without confidence: the target is assumed (the reference's rule)
            target_code = code_of(target)
            return Verdict("pass", metadata=self._record(options, target_code, 0.95))
        message = f"Language detected: {name_of(code)} ({code}) with confidence {float(confidence):.2f}"
        detail = self.detail(
            options,
            phase,
            detectedLanguage=name_of(code),
            isoCode=code,
            confidence=confidence,
            targetLanguages=options.target_languages,
        )
        if options.strategy == "block":
            return Verdict("block", f"Non-target language detected: {message}", detail)
        if options.strategy == "translate" and translated:
            extra: dict[str, Any] = {
                "translation": {
                    "original_language": name_of(code),
                    "target_language": target,
                    "translation_confidence": confidence,
                }
            }
            if options.preserve_original:
                extra["original_content"] = text
            metadata = self._record(options, code, confidence, **extra)
            return Verdict("replace", "", detail, text=translated, metadata=metadata)
        metadata = self._record(options, code, confidence)
        if options.strategy == "warn":
            shown = message if options.include_detection_details else name_of(code)
            shown = f"Non-target language: {shown}"
            return Verdict("warn", shown, detail, metadata=metadata)
        return Verdict("pass", metadata=metadata)  # detect (or translate without a translation)
