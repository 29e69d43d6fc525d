"""One word for one thing: the decision words of docs/DESIGN.md#glossary and the enums that
define them (the judge's ``ResumeAction``, the history's ``AuditAction``, the sensor's
``Verdict``, the ledger's ``StepStatus``) stay in step; the judge's words are recorded as
they are."""

import re
from pathlib import Path

from pipeline_defs.judging.step_evaluation import Verdict
from pipeline_defs.operations.operator_words import DECISION_ACTIONS
from pipeline_defs.resume.decision_types import ResumeAction
from pipeline_defs.resume.status import StepStatus
from resources.ledger.audit import AuditAction

DESIGN = Path(__file__).resolve().parents[2] / "docs" / "DESIGN.md"
ENUMS = {"action": ResumeAction, "history": AuditAction, "verdict": Verdict, "status": StepStatus}
ROW = re.compile(r"^\s*\|\s*`([a-z_]+)`\s*\|\s*([a-z, ]+?)\s*\|\s*(.+?)\s*\|\s*$")


def glossary() -> dict[str, set[str]]:
    text = DESIGN.read_text(encoding="utf-8")
    start = text.index('<a id="glossary"></a>')
    section = text[start : text.index("\n## ", start)]
    words: dict[str, set[str]] = {}
    for line in section.splitlines():
        found = ROW.match(line)
        if found is None:
            continue
        word, uses, _meaning = found.groups()
        assert word not in words, f"{word!r} is explained twice: one word, one meaning"
        words[word] = {u.strip() for u in uses.split(",")}
    return words


def test_the_glossary_names_every_word_where_it_is_used() -> None:
    documented = {(word, use) for word, uses in glossary().items() for use in uses}
    defined = {(m.value, use) for use, enum in ENUMS.items() for m in enum}
    assert documented - defined == set(), "the glossary names a use no enum has"
    assert defined - documented == set(), "an enum word the glossary does not explain"


def test_the_judges_words_are_recorded_as_they_are() -> None:
    history = {m.value for m in AuditAction}
    assert {a.value for a in ResumeAction} <= history
    assert {a.value for a in ResumeAction} | {"adopt", "claim_rejected"} == DECISION_ACTIONS
