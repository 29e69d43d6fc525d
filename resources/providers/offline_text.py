"""Deterministic offline text model: the default text provider (docs/DESIGN.md#reference-pipeline).

It answers each step's request (``TextCall.task``) with JSON built from the payload alone:
the story's own sentences, the names and costume cues found in it, templates and the
project style. The same call always gives the same answer, so a re-run with the same
inputs writes byte-identical checkpoints. No network, no wall clock, no global
randomness: any variety is derived from content hashes.

Like a real model it is not perfect: its close-up template forgets the project style and
its outfit prompts omit it too. The editorial step (``t2i_review``) catches exactly that,
so the offline demo exercises the mutator with real fixes.
"""

import hashlib
import json
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import Field

from pipeline_defs.resume.settings import MAX_OFFLINE_LATENCY_MS

from .base import (
    CONFIG_ERROR,
    INVALID_INPUT,
    TextCall,
    TextModel,
    TextReply,
    provider_error,
    simulated_latency_ms,
)

OFFLINE_TEXT_MODEL = "offline-text-v1"

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

_SENTENCE_SPLIT = re.compile(rf"(?<=[.!?][\"{RDQUO}{RSQUO}])\s+|(?<=[.!?])\s+|\n+")
_WORD = re.compile(rf"[A-Za-z][A-Za-z'{RSQUO}]*")
_COSTUME_CUE = re.compile(
    r"\b(?:wore|wears|wearing|dressed in|put on|puts on|pulled on|pulls on|changed into|"
    r"changes into|slipped into|slips into)\s+(?P<what>[^,.;:!?\"\u201d]+)",
    re.IGNORECASE,
)
_CUE_STOP = re.compile(r"\s+(?:and|as|while|until|but|when|before|after)\s+", re.IGNORECASE)


def _digest(*parts: object) -> int:
    """A stable integer from content, used wherever a 'model' would pick at random."""
    text = "\x1f".join(str(p) for p in parts)
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big")


def _words(text: str, limit: int) -> str:
    words = text.split()
    return " ".join(words[:limit]) + ("…" if len(words) > limit else "")


def split_sentences(text: str) -> list[str]:
    """Sentences of prose, closing quotes kept with their sentence."""
    return [s.strip() for s in _SENTENCE_SPLIT.split(text) if s.strip()]


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
    for match in _WORD.finditer(sentence):
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


def _clean_look(text: str) -> str:
    look = _CUE_STOP.split(text.strip(), maxsplit=1)[0].strip()
    lowered = look.lower()
    for det in DETERMINERS:
        if lowered.startswith(det):
            look = look[len(det) :]
            break
    words = look.split()
    while words and words[-1].lower() in TRAILING_FILLERS:
        words.pop()
    return " ".join(words[:MAX_LOOK_WORDS])


def _apposition(name: str, text: str) -> str | None:
    """'Mira, the lamplighter's apprentice,' → "lamplighter's apprentice"."""
    pattern = re.compile(
        rf"\b{re.escape(name)}(?:'s|{RSQUO}s)?,\s+(?:the|a|an)\s+([^,.;!?\"{RDQUO}]+)[,.;!?]"
    )
    match = pattern.search(text)
    return _words(match.group(1).strip(), MAX_LOOK_WORDS) if match else None


# ----------------------------------------------------------------------------- handlers
def _require(payload: Mapping[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    value = payload.get(key)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise provider_error(
            INVALID_INPUT, f"offline text model: payload field {key!r} is missing or malformed"
        )
    return value


def _segments(payload: Mapping[str, Any]) -> list[tuple[int, str]]:
    out = []
    for seg in _require(payload, "segments", list):
        if not isinstance(seg, Mapping) or not isinstance(seg.get("text"), str):
            raise provider_error(INVALID_INPUT, "offline text model: malformed segment")
        out.append((int(seg.get("scene_index", 1)), seg["text"]))
    return out


def entity_canon(payload: Mapping[str, Any]) -> dict[str, Any]:
    """Characters = capitalized single words used as names; outlooks = costume cues."""
    segments = _segments(payload)
    min_mentions = int(payload.get("min_mentions", 1))
    max_characters = int(payload.get("max_characters", 99))
    sentences = [(scene, s) for scene, text in segments for s in split_sentences(text)]
    names: set[str] = set()
    for _, sentence in sentences:
        names |= name_candidates(sentence)

    info: dict[str, dict[str, Any]] = {}
    last_named: str | None = None
    position = 0
    for scene, sentence in sentences:
        for token in tokens(sentence):
            if token.base in names:
                entry = info.setdefault(
                    token.base,
                    {"name": token.base, "mentions": 0, "first_scene": scene, "first_position": 0},
                )
                if entry["mentions"] == 0:
                    entry["first_position"] = position + token.start
                entry["mentions"] += 1
        for cue in _COSTUME_CUE.finditer(sentence):
            owner = last_named
            for token in tokens(sentence[: cue.start()]):
                if token.base in names:
                    owner = token.base
            look = _clean_look(cue.group("what"))
            if owner is None or not look:
                continue
            outlooks = info[owner].setdefault("outlooks", [])
            if look.lower() not in {o["description"].lower() for o in outlooks}:
                outlooks.append({"description": look, "first_scene": scene})
        for token in tokens(sentence):
            if token.base in names:
                last_named = token.base
        position += len(sentence) + 1

    full_text = "\n".join(text for _, text in segments)
    ranked = sorted(info.values(), key=lambda c: (-c["mentions"], c["first_position"], c["name"]))
    characters: list[dict[str, Any]] = []
    dropped: list[dict[str, Any]] = []
    for entry in ranked:
        entry.setdefault("outlooks", [])
        entry["description"] = _apposition(entry["name"], full_text) or "a character of the story"
        if entry["mentions"] < min_mentions or len(characters) >= max_characters:
            dropped.append({"name": entry["name"], "mentions": entry["mentions"]})
        else:
            characters.append(entry)
    return {"characters": characters, "dropped": dropped}


def world_guide(payload: Mapping[str, Any]) -> dict[str, Any]:
    """Style bible: tone from the story's words, palette seeded by title/style, places."""
    style = _require(payload, "style", str)
    title = str(payload.get("title") or "")
    scenes = _require(payload, "scenes", list)
    names = {str(c.get("name")) for c in payload.get("characters", []) if isinstance(c, Mapping)}
    counts = dict.fromkeys(MOODS, 0)
    locations: list[dict[str, Any]] = []
    seen: set[str] = set()
    for scene in scenes:
        text = str(scene.get("text", ""))
        for word in _WORD.findall(text.lower()):
            for mood, words in MOODS.items():
                counts[mood] += base_word(word) in words
        for sentence in split_sentences(text):
            for place in place_candidates(sentence, names):
                if place.lower() not in seen:
                    seen.add(place.lower())
                    locations.append({"name": place, "first_scene": scene.get("scene_index")})
    tone = max(sorted(counts), key=lambda m: counts[m])
    seed = hashlib.sha256(f"{title}|{style}|{tone}".encode()).hexdigest()
    palette = [f"#{seed[i : i + 6]}" for i in range(0, 30, 6)]
    cast = [
        {"character_id": c.get("character_id"), "name": c.get("name"), "look": c.get("description")}
        for c in payload.get("characters", [])
        if isinstance(c, Mapping)
    ]
    return {
        "style": style,
        "tone": tone,
        "lighting": LIGHTING_BY_MOOD[tone],
        "palette": palette,
        "locations": locations,
        "cast": cast,
        "rules": [
            f"every frame is drawn as {style}",
            "a character keeps one outfit per scene; outfits change only where the story says",
            "reference sheets decide faces and proportions; never improvise a character",
        ],
    }


def _subject(characters: Sequence[Mapping[str, Any]]) -> str:
    parts = []
    for c in characters:
        look = c.get("look")
        parts.append(
            f"{c['name']} in {look}" if c.get("outlook_id") != "O00" and look else c["name"]
        )
    if not parts:
        return "the empty scene"
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def scene_detail(payload: Mapping[str, Any]) -> dict[str, Any]:
    """Shots = evenly spread sentences that name characters; prompts from templates."""
    scene_index = _require(payload, "scene_index", int)
    text = _require(payload, "text", str)
    style = _require(payload, "style", str)
    camera_style = str(payload.get("camera_style") or "")
    shots_wanted = max(1, int(payload.get("shots_per_scene", 1)))
    variations_wanted = max(1, int(payload.get("variations_per_shot", 1)))
    characters = [c for c in payload.get("characters", []) if isinstance(c, Mapping)]
    by_name = {str(c["name"]): c for c in characters}
    sentences = split_sentences(text) or [text.strip() or str(payload.get("heading", ""))]

    def named(sentence: str) -> list[Mapping[str, Any]]:
        seen: list[str] = []
        for token in tokens(sentence):
            if token.base in by_name and token.base not in seen:
                seen.append(token.base)
        return [by_name[n] for n in seen]

    beats = [s for s in sentences if named(s)] or sentences
    scene_cast = [c for s in sentences for c in named(s)]
    places = [p for s in sentences for p in place_candidates(s, set(by_name))]
    locations = [str(p) for p in payload.get("locations", []) if str(p) in text]
    setting = (locations or places or [str(payload.get("heading") or "the scene")])[0]
    shots = []
    for k in range(shots_wanted):
        beat = (
            beats[(k * len(beats)) // shots_wanted]
            if len(beats) >= shots_wanted
            else beats[k % len(beats)]
        )
        cast = named(beat) or scene_cast[:1]
        camera = CAMERAS[k % len(CAMERAS)]
        unquoted = re.sub(f'["{LDQUO}{RDQUO}]', "", beat).strip()
        description = _words(unquoted, MAX_DESCRIPTION_WORDS)
        subject = _subject(cast)
        variations = []
        for v in range(variations_wanted):
            light = LIGHTS[(_digest(scene_index, k) + v) % len(LIGHTS)]
            if camera == "close-up":
                prompt = f"close-up of {subject}: {description} {light}."
            else:
                prompt = f"{camera} of {subject} at {setting}: {description} {light}, {style}."
            variations.append({"t2i_prompt": prompt, "lighting": light})
        shots.append(
            {
                "shot_index": k,
                "description": description,
                "camera_direction": f"{camera}, {camera_style}" if camera_style else camera,
                "characters": [str(c["character_id"]) for c in cast],
                "variations": variations,
            }
        )
    return {
        "summary": _words(sentences[0], MAX_DESCRIPTION_WORDS),
        "setting": setting,
        "shots": shots,
    }


def entity_t2i(payload: Mapping[str, Any]) -> dict[str, Any]:
    """One prompt per (character, outlook); outfit prompts forget the style (review fixes it)."""
    style = _require(payload, "style", str)
    prompts = []
    for c in _require(payload, "characters", list):
        name, description = c["name"], c.get("description") or "a character"
        for outlook in c.get("outlooks", []):
            if outlook["outlook_id"] == "O00":
                prompt = (
                    f"character reference sheet of {name}, {description}, full body, front and "
                    f"side views, neutral background, {style}"
                )
            else:
                prompt = f"{name} wearing {outlook['description']}, full body, neutral background"
            prompts.append(
                {
                    "character_id": c["character_id"],
                    "outlook_id": outlook["outlook_id"],
                    "t2i_prompt": prompt,
                }
            )
    return {"prompts": prompts}


def shot_dependency(payload: Mapping[str, Any]) -> dict[str, Any]:
    """Which reference images each shot needs, and how to compose them."""
    style = _require(payload, "style", str)
    shots = []
    for shot in _require(payload, "shots", list):
        cast = [c for c in shot.get("characters", []) if isinstance(c, Mapping)]
        if cast:
            prompt = (
                f"{shot.get('camera_direction')}: place {_subject(cast)} exactly as in their "
                f"reference images; match {style}"
            )
        else:
            prompt = f"{shot.get('camera_direction')}: environment only, no characters; {style}"
        shots.append(
            {
                "shot_id": shot["shot_id"],
                "needs": [
                    {"character_id": c["character_id"], "outlook_id": c["outlook_id"]} for c in cast
                ],
                "dependency_prompt": prompt,
            }
        )
    return {"shots": shots}


def t2i_review(payload: Mapping[str, Any]) -> dict[str, Any]:
    """Editorial pass: every prompt must carry the project style and the required keywords."""
    style = _require(payload, "style", str)
    keywords = [style, *[str(k) for k in payload.get("required_keywords", [])]]
    fixes = []
    for item in _require(payload, "items", list):
        prompt = str(item.get("t2i_prompt", ""))
        missing = [k for k in dict.fromkeys(keywords) if k and k.lower() not in prompt.lower()]
        if missing:
            fixes.append(
                {
                    "item_id": item["item_id"],
                    "t2i_prompt": prompt.rstrip(" .") + ", " + ", ".join(missing),
                    "reason": f"missing required keyword(s): {', '.join(missing)}",
                }
            )
    return {"fixes": fixes, "reviewed": len(payload["items"])}


HANDLERS: Mapping[str, Callable[[Mapping[str, Any]], dict[str, Any]]] = {
    "entity_canon": entity_canon,
    "world_guide": world_guide,
    "scene_detail": scene_detail,
    "entity_t2i": entity_t2i,
    "shot_dependency": shot_dependency,
    "t2i_review": t2i_review,
}


class OfflineTextModel(TextModel):
    """Deterministic text 'model': same call, same JSON; no network, clock or global RNG."""

    latency_ms: int | None = Field(
        default=None,
        ge=0,
        le=MAX_OFFLINE_LATENCY_MS,  # the bound PIPELINE_OFFLINE_LATENCY_MS has in the settings
        description="Simulated latency per call; None = PIPELINE_OFFLINE_LATENCY_MS at call time",
    )

    @property
    def model_name(self) -> str:
        return OFFLINE_TEXT_MODEL

    def complete(self, call: TextCall) -> TextReply:
        """Dispatch on ``call.task``; an unknown task is a configuration error, not a guess."""
        handler = HANDLERS.get(call.task)
        if handler is None:
            raise provider_error(
                CONFIG_ERROR,
                f"offline text model has no handler for task {call.task!r} "
                f"(known: {', '.join(sorted(HANDLERS))})",
            )
        try:
            data = handler(call.payload)
        except (KeyError, TypeError, ValueError) as exc:
            raise provider_error(
                INVALID_INPUT,
                f"offline text model: malformed payload for task {call.task!r}: "
                f"{type(exc).__name__}: {exc}",
            ) from None
        # Rough token count, deterministic, so the cost ledger has something to add up.
        size = len(call.prompt) + len(json.dumps(dict(call.payload), default=str))
        units = max(1, (size + len(json.dumps(data))) // 4)
        delay = simulated_latency_ms(self.latency_ms)
        if delay > 0:
            time.sleep(delay / 1000)
        return TextReply(data=data, units=units, model=OFFLINE_TEXT_MODEL)
