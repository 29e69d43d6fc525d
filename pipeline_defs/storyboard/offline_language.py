"""How the offline text model reads prose: sentences, names, places, costume cues, moods.

The storyboard's steps answer their own offline requests (each step's ``offline_reply``,
beside the step); what those answers share lives here. Everything is derived from the
text and content hashes: the same call always gives the same answer, so a re-run with the
same inputs writes byte-identical checkpoints. No network, no wall clock, no global
randomness.

Like a real model it is not perfect: its close-up template forgets the project style and
its outfit prompts omit it too. The editorial step (``t2i_review``) catches exactly that,
so the offline demo exercises the mutator with real fixes.
"""

import hashlib
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from resources.providers.base import INVALID_INPUT, provider_error

# Words that start with a capital letter mid-sentence without naming anyone.
_STOPWORDS_TEXT = """a an and as at but by for from he her hers him his i if in into it its me
    my no not of on or our she so that the their them then there these they this those to up
    us was we were what when where which while who why will with without you your yes oh ah
    mr mrs ms dr sir madam lady lord captain monday tuesday wednesday thursday friday
    saturday sunday january february march april may june july august september october
    november december god"""
STOPWORDS = frozenset(_STOPWORDS_TEXT.split())
ARTICLES = frozenset({"the", "a", "an"})
DETERMINERS = ("a ", "an ", "the ", "her ", "his ", "their ", "its ", "my ", "our ", "your ")
TRAILING_FILLERS = frozenset({"again", "now", "still", "too", "today", "tonight", "once"})
# Typographic quotes, spelled as escapes so no reader mistakes them for ASCII ones.
LSQUO, RSQUO, LDQUO, RDQUO = "\u2018", "\u2019", "\u201c", "\u201d"
OPENERS = f"\"'([«{LDQUO}{LSQUO}"
MAX_LOOK_WORDS = 8
MAX_DESCRIPTION_WORDS = 30

CAMERAS = (
    "wide establishing shot",
    "close-up",
    "medium shot",
    "over-the-shoulder shot",
    "low-angle shot",
    "high-angle shot",
)
LIGHTS = ("soft dusk light", "lantern glow", "overcast daylight", "stormlight", "low golden sun")
_MOOD_WORDS = {
    "brooding": "storm rain wind dark night black shook screamed iron sputtered swallow",
    "festive": "fair dance danced music fiddles festival sang laughed bowed",
    "tender": "blanket gave asleep home kept steady yours quiet",
}
MOODS: Mapping[str, frozenset[str]] = {m: frozenset(w.split()) for m, w in _MOOD_WORDS.items()}
LIGHTING_BY_MOOD = {
    "brooding": "hard contrast, wet highlights, deep blue shadows",
    "festive": "warm lantern pools against night blue",
    "tender": "soft diffuse morning light",
}

SENTENCE_SPLIT = re.compile(rf"(?<=[.!?][\"{RDQUO}{RSQUO}])\s+|(?<=[.!?])\s+|\n+")
WORD = re.compile(rf"[A-Za-z][A-Za-z'{RSQUO}]*")
COSTUME_CUE = re.compile(
    r"\b(?:wore|wears|wearing|dressed in|put on|puts on|pulled on|pulls on|changed into|"
    r"changes into|slipped into|slips into)\s+(?P<what>[^,.;:!?\"\u201d]+)",
    re.IGNORECASE,
)
CUE_STOP = re.compile(r"\s+(?:and|as|while|until|but|when|before|after)\s+", re.IGNORECASE)


def digest(*parts: object) -> int:
    """A stable integer from content, used wherever a 'model' would pick at random."""
    text = "\x1f".join(str(p) for p in parts)
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big")


def words_of(text: str, limit: int) -> str:
    words = text.split()
    return " ".join(words[:limit]) + ("…" if len(words) > limit else "")


def split_sentences(text: str) -> list[str]:
    """Sentences of prose, closing quotes kept with their sentence."""
    return [s.strip() for s in SENTENCE_SPLIT.split(text) if s.strip()]


def base_word(word: str) -> str:
    """``Mira's`` → ``Mira``: possessives name the same person."""
    for suffix in ("'s", f"{RSQUO}s"):
        if word.endswith(suffix):
            return word[: -len(suffix)]
    return word.rstrip("'" + RSQUO)


@dataclass(frozen=True)
class Token:
    word: str
    start: int
    end: int
    initial: bool  # first word of a sentence or of a quotation: capitalized by grammar

    @property
    def base(self) -> str:
        return base_word(self.word)

    @property
    def capitalized(self) -> bool:
        return self.word[:1].isupper()


def tokens(sentence: str) -> list[Token]:
    out: list[Token] = []
    for match in WORD.finditer(sentence):
        before = sentence[: match.start()].rstrip()
        initial = not out or (bool(before) and before[-1] in OPENERS)
        out.append(Token(match.group(), match.start(), match.end(), initial))
    return out


def capitalized_runs(sentence: str) -> Iterator[tuple[list[Token], Token | None]]:
    """Runs of adjacent capitalized words (grammatical capitals dropped) and the word before."""
    words = tokens(sentence)
    i = 0
    while i < len(words):
        if not words[i].capitalized:
            i += 1
            continue
        j = i + 1
        while (
            j < len(words)
            and words[j].capitalized
            and not sentence[words[j - 1].end : words[j].start].strip()
        ):
            j += 1
        run = words[i:j]
        if run[0].initial:
            run = run[1:]
        if run:
            before = words[i - 1] if i > 0 else None
            yield run, before
        i = j


def name_candidates(sentence: str) -> set[str]:
    """Single capitalized words mid-sentence, not after an article: people's names."""
    found: set[str] = set()
    for run, before in capitalized_runs(sentence):
        if len(run) != 1:
            continue
        word = run[0].base
        if word.lower() in STOPWORDS or len(word) < 2:
            continue
        if before is not None and before.word.lower() in ARTICLES:
            continue
        found.add(word)
    return found


def place_candidates(sentence: str, names: set[str]) -> list[str]:
    """Multi-word capitalized runs, or a capitalized word after 'the': places."""
    found: list[str] = []
    for run, before in capitalized_runs(sentence):
        words = [t.base for t in run]
        if len(words) >= 2 or (before is not None and before.word.lower() == "the"):
            if len(words) == 1 and words[0] in names:
                continue
            found.append(" ".join(words))
    return found


def clean_look(text: str) -> str:
    look = CUE_STOP.split(text.strip(), maxsplit=1)[0].strip()
    lowered = look.lower()
    for det in DETERMINERS:
        if lowered.startswith(det):
            look = look[len(det) :]
            break
    words = look.split()
    while words and words[-1].lower() in TRAILING_FILLERS:
        words.pop()
    return " ".join(words[:MAX_LOOK_WORDS])


def apposition(name: str, text: str) -> str | None:
    """'Mira, the lamplighter's apprentice,' → "lamplighter's apprentice"."""
    pattern = re.compile(
        rf"\b{re.escape(name)}(?:'s|{RSQUO}s)?,\s+(?:the|a|an)\s+([^,.;!?\"{RDQUO}]+)[,.;!?]"
    )
    match = pattern.search(text)
    return words_of(match.group(1).strip(), MAX_LOOK_WORDS) if match else None


def require(payload: Mapping[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    value = payload.get(key)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise provider_error(
            INVALID_INPUT, f"offline text model: payload field {key!r} is missing or malformed"
        )
    return value


def segments(payload: Mapping[str, Any]) -> list[tuple[int, str]]:
    out = []
    for seg in require(payload, "segments", list):
        if not isinstance(seg, Mapping) or not isinstance(seg.get("text"), str):
            raise provider_error(INVALID_INPUT, "offline text model: malformed segment")
        out.append((int(seg.get("scene_index", 1)), seg["text"]))
    return out


def subject(characters: Sequence[Mapping[str, Any]]) -> str:
    parts = []
    for c in characters:
        look = c.get("look")
        parts.append(
            f"{c['name']} in {look}" if c.get("outlook_id") != "O00" and look else c["name"]
        )
    if not parts:
        return "the empty scene"
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
