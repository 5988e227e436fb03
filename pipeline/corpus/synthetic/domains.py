"""The six domains of the synthetic corpus, each a generator of (user, assistant) turns.

Each domain has its own structure and predictability: translation and
summarisation are nearly deterministic given the prompt, chat is loose.
`DOMAINS` maps a name to its generator `(rng, num_turns) -> turns`; the first
user turn states the task, later ones follow up on it.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from pipeline.corpus.synthetic.world import (
    ITEMS,
    NAMES,
    TOY_ADJS,
    TOY_NOUNS,
    TOY_VERBS,
    Country,
    world,
)

Turns = list[tuple[str, str]]


def _math(rng: random.Random, num_turns: int) -> Turns:
    name, other = rng.sample(NAMES, 2)
    item = rng.choice(ITEMS)
    start = rng.randint(3, 40)
    ops: list[tuple[str, int]] = []
    for _ in range(rng.randint(1, 3)):
        ops.append((rng.choice(["buy", "give", "find", "lose"]), rng.randint(1, 12)))
    # Removals are capped by the smallest possible start, so counts never go negative.
    low = 3
    for i, (op, n) in enumerate(ops):
        if op in ("give", "lose") and low > 0:
            n = min(n, low)
            ops[i] = (op, n)
            low -= n
        elif op in ("give", "lose"):
            ops[i] = ("buy", n)
            low += n
        else:
            low += n

    def solve(begin: int) -> tuple[str, list[str], int]:
        story = [f"{name} has {begin} {item}."]
        steps = [f"Step 1: {name} starts with {begin} {item}."]
        total = begin
        for i, (op, n) in enumerate(ops, start=2):
            if op == "buy":
                story.append(f"Then {name} buys {n} more.")
                steps.append(f"Step {i}: {name} buys {n}, so {total} + {n} = {total + n}.")
                total += n
            elif op == "find":
                story.append(f"Then {name} finds {n} more.")
                steps.append(f"Step {i}: {name} finds {n}, so {total} + {n} = {total + n}.")
                total += n
            elif op == "give":
                story.append(f"Then {name} gives {n} to {other}.")
                steps.append(f"Step {i}: {name} gives away {n}, so {total} - {n} = {total - n}.")
                total -= n
            else:
                story.append(f"Then {name} loses {n}.")
                steps.append(f"Step {i}: {name} loses {n}, so {total} - {n} = {total - n}.")
                total -= n
        return " ".join(story), steps, total

    story, steps, total = solve(start)
    question = f"{story} How many {item} does {name} have now?"
    turns = [(question, "\n".join(steps + [f"Answer: {total}"]))]
    for _ in range(num_turns - 1):
        start = rng.randint(3, 40)
        _, steps, total = solve(start)
        turns.append(
            (
                f"What if {name} had started with {start} {item}?",
                "\n".join(steps + [f"Answer: {total}"]),
            )
        )
    return turns


_CODE_TASKS: tuple[tuple[str, str, Callable[[str, str], list[str]]], ...] = (
    (
        "returns the sum of a list of numbers",
        "total",
        lambda f, a: [
            f"def {f}({a}):",
            f'    """Return the sum of {a}."""',
            "    result = 0",
            f"    for x in {a}:",
            "        result += x",
            "    return result",
        ],
    ),
    (
        "returns the largest number in a list",
        "largest",
        lambda f, a: [
            f"def {f}({a}):",
            f'    """Return the largest item of {a}."""',
            f"    best = {a}[0]",
            f"    for x in {a}[1:]:",
            "        if x > best:",
            "            best = x",
            "    return best",
        ],
    ),
    (
        "reverses a string",
        "reverse",
        lambda f, a: [f"def {f}({a}):", f'    """Return {a} reversed."""', f"    return {a}[::-1]"],
    ),
    (
        "counts the vowels in a string",
        "count_vowels",
        lambda f, a: [
            f"def {f}({a}):",
            f'    """Count the vowels in {a}."""',
            "    count = 0",
            f"    for ch in {a}.lower():",
            '        if ch in "aeiou":',
            "            count += 1",
            "    return count",
        ],
    ),
    (
        "checks whether a number is even",
        "is_even",
        lambda f, a: [
            f"def {f}({a}):",
            f'    """Return True if {a} is even."""',
            f"    return {a} % 2 == 0",
        ],
    ),
    (
        "computes the factorial of n",
        "factorial",
        lambda f, a: [
            f"def {f}({a}):",
            f'    """Return {a}! for {a} >= 0."""',
            "    result = 1",
            f"    for i in range(2, {a} + 1):",
            "        result *= i",
            "    return result",
        ],
    ),
    (
        "keeps only the positive numbers of a list",
        "positives",
        lambda f, a: [
            f"def {f}({a}):",
            f'    """Return the items of {a} that are > 0."""',
            f"    return [x for x in {a} if x > 0]",
        ],
    ),
    (
        "returns the average of a list of numbers",
        "average",
        lambda f, a: [
            f"def {f}({a}):",
            f'    """Return the mean of {a}."""',
            f"    if not {a}:",
            "        return 0.0",
            f"    return sum({a}) / len({a})",
        ],
    ),
)
_ARG_NAMES = ("values", "items", "numbers", "data", "xs", "text", "word", "n", "value")
_TEST_INPUTS = {
    "total": ("[1, 2, 3]", "6"),
    "largest": ("[4, 9, 2]", "9"),
    "reverse": ('"abc"', '"cba"'),
    "count_vowels": ('"banana"', "3"),
    "is_even": ("4", "True"),
    "factorial": ("5", "120"),
    "positives": ("[-1, 2, 3]", "[2, 3]"),
    "average": ("[2, 4]", "3.0"),
}


def _code(rng: random.Random, num_turns: int) -> Turns:
    task, base, body = rng.choice(_CODE_TASKS)
    func = rng.choice([base, f"{base}_of", f"get_{base}", f"compute_{base}"])
    arg = rng.choice(_ARG_NAMES)
    lang = rng.choice(["Python", "a Python function"])
    prompt = rng.choice(
        [
            f"Write {lang} that {task}.",
            f"Please write a function called {func} that {task}.",
            f"I need code that {task}. Call it {func}.",
        ]
    )
    code = "\n".join(body(func, arg))
    turns = [(prompt, f"Here is the function:\n```python\n{code}\n```")]
    follow_ups = [
        (
            "Now add a test for it.",
            lambda: (
                "```python\n"
                + f"assert {func}({_TEST_INPUTS[base][0]}) == {_TEST_INPUTS[base][1]}"
                + "\n```"
            ),
        ),
        (
            "Explain how it works.",
            lambda: (
                f"The function {func} takes {arg} and {task}. It returns the result to the caller."
            ),
        ),
        (
            f"Rename the argument to {arg}_in.",
            lambda: "```python\n" + "\n".join(body(func, f"{arg}_in")) + "\n```",
        ),
    ]
    for user, answer in rng.sample(follow_ups, k=min(num_turns - 1, len(follow_ups))):
        turns.append((user, answer()))
    return turns


def _toy_sentence(rng: random.Random) -> tuple[str, str]:
    """An English sentence and its toy-language translation (SOV, adjective after noun)."""
    lex = world().lexicon
    subj, obj = rng.sample(TOY_NOUNS, 2)
    verb = rng.choice(TOY_VERBS)
    adj_s = rng.choice(TOY_ADJS) if rng.random() < 0.5 else None
    adj_o = rng.choice(TOY_ADJS) if rng.random() < 0.5 else None
    eng = (
        ["the"]
        + ([adj_s] if adj_s else [])
        + [subj, verb, "the"]
        + ([adj_o] if adj_o else [])
        + [obj]
    )
    toy = (
        [lex["the"], lex[subj]]
        + ([lex[adj_s]] if adj_s else [])
        + [lex["the"], lex[obj]]
        + ([lex[adj_o]] if adj_o else [])
        + [lex[verb]]
    )
    return " ".join(eng).capitalize() + ".", " ".join(toy).capitalize() + "."


def _translation(rng: random.Random, num_turns: int) -> Turns:
    tongue = world().countries[0].language
    turns: Turns = []
    for i in range(num_turns):
        eng, toy = _toy_sentence(rng)
        to_toy = rng.random() < 0.6
        if i == 0:
            user = (
                f"Translate into {tongue}: {eng}"
                if to_toy
                else f"Translate from {tongue} into English: {toy}"
            )
        else:
            user = f"And this one: {eng if to_toy else toy}"
        answer = f"In {tongue}: {toy}" if to_toy else f"In English: {eng}"
        turns.append((user, answer))
    return turns


_QA_FIELDS: tuple[tuple[str, Callable[[Country], str]], ...] = (
    ("What is the capital of {c}?", lambda c: f"The capital of {c.name} is {c.capital}."),
    ("Which river flows through {c}?", lambda c: f"The river {c.river} flows through {c.name}."),
    ("What language is spoken in {c}?", lambda c: f"People in {c.name} speak {c.language}."),
    (
        "How many people live in {c}?",
        lambda c: f"About {c.population_millions} million people live in {c.name}.",
    ),
    ("When was {c} founded?", lambda c: f"{c.name} was founded in {c.founded}."),
    ("What does {c} export?", lambda c: f"{c.name} is known for exporting {c.export}."),
)


def _qa(rng: random.Random, num_turns: int) -> Turns:
    country = rng.choice(world().countries)
    picks = rng.sample(_QA_FIELDS, k=min(num_turns, len(_QA_FIELDS)))
    turns: Turns = []
    for i, (question, answer) in enumerate(picks):
        q = question.format(c=country.name if i == 0 else "it")
        turns.append((q, answer(country)))
    return turns


_EVENTS = (
    "opened a bakery",
    "won a chess match",
    "planted a garden",
    "built a bridge",
    "wrote a song",
    "found a lost dog",
    "painted a mural",
    "repaired a clock",
)
_FILLER = (
    "The weather was mild that day.",
    "Many neighbours came to watch.",
    "It had rained the night before.",
    "Children played near the square.",
    "A local band was practising nearby.",
    "The market was busy as usual.",
    "Nobody expected it to take so long.",
    "Later, everyone went home.",
)
_DAYS = "Monday Tuesday Wednesday Thursday Friday Saturday Sunday".split()


def _summarisation(rng: random.Random, num_turns: int) -> Turns:
    who = rng.choice(NAMES)
    event = rng.choice(_EVENTS)
    place = rng.choice(world().countries).capital
    day = rng.choice(_DAYS)
    filler = rng.sample(_FILLER, k=rng.randint(2, 4))
    key = f"On {day}, {who} {event} in {place}."
    sentences = filler[:]
    sentences.insert(rng.randint(0, len(sentences)), key)
    passage = " ".join(sentences)
    turns = [
        (
            f"Summarize this in one sentence: {passage}",
            f"Summary: {who} {event} in {place} on {day}.",
        )
    ]
    if num_turns > 1:
        turns.append(("Who was it about?", f"It was about {who}."))
    if num_turns > 2:
        turns.append(("Where did it happen?", f"It happened in {place}."))
    return turns


_CHAT_OPENERS = (
    "Hi!",
    "Hello there.",
    "Good morning!",
    "Hey, how are you?",
    "I am bored.",
    "Can you recommend something to do?",
    "What should I cook tonight?",
    "Tell me something nice.",
    "I had a long day.",
)
_CHAT_TOPICS = (
    "a walk in the park",
    "a new book",
    "a warm soup",
    "a short nap",
    "calling a friend",
    "a puzzle",
    "some music",
    "a cup of tea",
    "drawing",
    "a board game",
)
_CHAT_MOODS = (
    "That sounds lovely.",
    "I hope you enjoy it.",
    "It might help you relax.",
    "Many people like that.",
    "Let me know how it goes.",
    "Take your time.",
)


def _chat(rng: random.Random, num_turns: int) -> Turns:
    turns: Turns = []
    for i in range(num_turns):
        user = (
            rng.choice(_CHAT_OPENERS)
            if i == 0
            else rng.choice(
                ["Thanks!", "Any other idea?", "Why?", "Okay, what else?", "That is nice."]
            )
        )
        parts = [rng.choice(["Sure!", "Of course.", "Happy to help.", "Hello!", "Good question."])]
        first, second = rng.sample(_CHAT_TOPICS, 2)
        parts.append(f"How about {first}?")
        if rng.random() < 0.7:
            parts.append(f"Or maybe {second}.")
        parts.append(rng.choice(_CHAT_MOODS))
        turns.append((user, " ".join(parts)))
    return turns


DOMAINS: dict[str, Callable[[random.Random, int], Turns]] = {
    "math": _math,
    "code": _code,
    "translation": _translation,
    "qa": _qa,
    "summarization": _summarisation,
    "chat": _chat,
}
