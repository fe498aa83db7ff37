"""The Hermes-3 part rule (andrea/hermes3_parts.py): its labelled set, its held-out precision and
recall, and clear cases of each part written apart from the set."""

import pytest

from andrea import hermes3_parts as hp
from andrea import hermes3_parts_weights as pw

TARGET = 0.9


def test_labelled_set_is_large_and_balanced_enough():
    items = hp.labelled_set()
    assert len(items) >= 300
    per_part = {p: sum(it.part == p for it in items) for p in hp.HERMES3_PARTS}
    assert all(n >= 60 for n in per_part.values()), per_part
    assert all(it.user for it in items)
    # system prompts of every kind the header names: none, and some
    assert sum(bool(it.system) for it in items) >= 100 and sum(not it.system for it in items) >= 100


def test_cross_validated_precision_and_recall_meet_the_target_on_the_shipped_set():
    cv = hp.cross_validate()
    for part in hp.HERMES3_PARTS:
        assert cv[part]["precision"] >= TARGET and cv[part]["recall"] >= TARGET, (part, cv[part], cv["misclassified"][:10])


def test_shipped_weights_and_figures_belong_to_the_shipped_set():
    """The weights module was refitted after the last change to the set (`python -m
    andrea.hermes3_parts fit`), so the figures the manifest reports are the ones measured now."""
    assert pw.LABELLED_SET_SHA256 == hp.labelled_set_digest()
    assert tuple(pw.FEATURES) == hp.FEATURES
    assert pw.CROSS_VALIDATED == hp._figures(hp.cross_validate())
    assert pw.IN_SAMPLE == hp._figures(hp.evaluate())
    refit = hp.fit()
    assert refit["roleplay"][0] == pytest.approx(list(pw.ROLEPLAY_WEIGHTS), abs=1e-6)
    assert refit["creative"][1] == pytest.approx(pw.CREATIVE_INTERCEPT, abs=1e-6)


def test_cross_validation_fits_on_the_training_folds_only(monkeypatch):
    items = hp.labelled_set()
    seen = []
    real = hp._fit_design

    def spy(X, y):
        seen.append(len(y))
        return real(X, y)

    monkeypatch.setattr(hp, "_fit_design", spy)
    hp.cross_validate(items, k=5, repeats=2)
    assert len(seen) == 10
    assert all(0.75 * len(items) <= n <= 0.85 * len(items) for n in seen), seen


@pytest.mark.parametrize("system, user", [
    ("", "Write a sonnet about a cat watching the rain through a window."),
    ("", "Compose song lyrics about a summer road trip with a catchy chorus."),
    ("You are a helpful assistant.", "Tell me a bedtime story about a turtle who wants to fly."),
    ("", "Continue the story: The clock struck thirteen, and the house began to breathe."),
    ("", "Invent a magic system based on music, where every spell is a melody."),
    ("", "Write a screenplay scene in which two rival magicians meet in a train station."),
])
def test_clear_creative_requests(system, user):
    assert hp.part_by_rule(system, user) == hp.CREATIVE, hp.explain(system, user)


@pytest.mark.parametrize("system, user", [
    ("You are Mirela, a fortune teller at a travelling fair. Stay in character.",
     "*sits down at your table and offers my palm* What do you see, Mirela?"),
    ("", "Let's roleplay: you're a grumpy troll guarding a bridge and I'm a goat who wants to cross. *trots up to the bridge*"),
    ("Name: Toren\nPersonality: proud, honest, quick to anger\nScenario: Toren is the captain of the guard; {{user}} is a thief he caught.",
     "\"I swear I didn't take anything!\" *I struggle against the rope*"),
    ("You are the game master of a space exploration text adventure. The user is the pilot.",
     "I power up the engines and set a course for the nebula."),
])
def test_clear_roleplay_scenes(system, user):
    assert hp.part_by_rule(system, user) == hp.ROLEPLAY, hp.explain(system, user)


@pytest.mark.parametrize("system, user", [
    ("", "How do I convert a list of strings to integers in Python?"),
    ("You are a helpful assistant.", "What is the capital of Canada?"),
    ("", "Write an email to my manager asking for Friday off."),
    ("", "Write a function that returns the nth Fibonacci number."),
    ("", "What is the main theme of the poem 'The Road Not Taken'?"),
    ("You are Zara, a friendly support assistant for a phone company.", "How do I check my data usage?"),
    ("You are a function calling AI model. <tools>[{\"name\": \"get_time\"}]</tools>", "What time is it in Tokyo?"),
])
def test_clear_general_requests(system, user):
    assert hp.part_by_rule(system, user) == hp.GENERAL, hp.explain(system, user)


def test_first_exchange_reads_the_system_turns_and_the_first_user_turn():
    conv = [{"from": "system", "value": "You are Vex."}, {"from": "human", "value": "*waves*"},
            {"from": "gpt", "value": "Hi."}, {"from": "human", "value": "Write a poem."}]
    assert hp.first_exchange(conv) == ("You are Vex.", "*waves*")
    assert hp.first_exchange([{"from": "human", "value": "hi"}]) == ("", "hi")


def test_a_malformed_labelled_set_is_a_clear_error(tmp_path):
    bad = tmp_path / "set.txt"
    bad.write_text("%%% poetry | x\n@user\nhi\n")
    with pytest.raises(ValueError, match=r"set\.txt:1: bad header"):
        hp.labelled_set(str(bad))
    bad.write_text("%%% general | x\n@system\nYou are a helper.\n")
    with pytest.raises(ValueError, match=r"set\.txt:1: entry without an @user block"):
        hp.labelled_set(str(bad))
