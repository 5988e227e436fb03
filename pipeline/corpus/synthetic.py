"""A deterministic multi-domain chat corpus for the toy target, the demo and the tests.

Six domains shaped like the evaluation domains of speculative-decoding papers
(math word problems, code, translation, question answering, summarisation,
open chat). Each domain has its own structure and its own predictability:
translation and summarisation are nearly deterministic given the prompt,
chat is loose. A target trained on it therefore answers with domain structure,
and a draft's acceptance length differs by domain as it does on real models.

Everything derives from the seed: the same spec always yields the same
conversations, in the same order, byte for byte. The "world" (fictional
countries, the toy language's lexicon) derives from a fixed world seed, so
facts stay consistent across corpus seeds and a held-out corpus (another seed)
asks about the same world.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from pydantic import Field, field_validator

from pipeline.config import ConfigModel

Message = dict[str, str]
Conversation = dict[str, object]

WORLD_SEED = 20261130
# Bump when generated text changes: models trained on the corpus key their caches on it.
CORPUS_VERSION = 1

SYSTEM_PROMPTS = (
    "You are a helpful assistant.",
    "You are a concise assistant. Answer clearly.",
    "You are a patient tutor.",
)

# --------------------------------------------------------------------------- the world


NAMES = (
    "Mia Leo Ava Noah Zoe Liam Ivy Omar Emma Ruben Sara Tom Nina Hugo Lena Ali Ines Max Rosa Yuki"
).split()
ITEMS = "apples pencils coins books stickers marbles cookies stamps shells cards".split()


def _syllable_word(rng: random.Random, min_syl: int = 2, max_syl: int = 3) -> str:
    onsets = "b d f g k l m n p r s t v z br kr st tr sh".split()
    vowels = "a e i o u ai ei ou".split()
    codas = ["", "", "n", "r", "s", "k", "l"]
    parts = [
        rng.choice(onsets) + rng.choice(vowels) + rng.choice(codas)
        for _ in range(rng.randint(min_syl, max_syl))
    ]
    return "".join(parts)


@dataclass(frozen=True)
class Country:
    name: str
    capital: str
    river: str
    language: str
    population_millions: int
    founded: int
    export: str


@dataclass(frozen=True)
class World:
    countries: tuple[Country, ...]
    # English word -> toy-language word, per part of speech.
    lexicon: dict[str, str] = field(hash=False)


TOY_NOUNS = "cat dog bird fish child farmer king river tree house boat apple".split()
TOY_VERBS = "sees eats finds likes carries follows".split()
TOY_ADJS = "small big red green old quick happy".split()


@lru_cache(maxsize=1)
def world() -> World:
    """The fixed fictional world every corpus seed shares."""
    rng = random.Random(WORLD_SEED)
    exports = "salt copper wool tea glass timber spices silver".split()
    used: set[str] = set()

    def fresh(min_syl: int = 2, max_syl: int = 3) -> str:
        while True:
            word = _syllable_word(rng, min_syl, max_syl)
            if word not in used:
                used.add(word)
                return word

    countries = tuple(
        Country(
            name=fresh().capitalize() + rng.choice(["ia", "land", "ar", "mor"]),
            capital=fresh().capitalize(),
            river=fresh().capitalize(),
            language=fresh(2, 2).capitalize() + "ic",
            population_millions=rng.randint(2, 90),
            founded=rng.randint(1200, 1950),
            export=rng.choice(exports),
        )
        for _ in range(16)
    )
    lexicon = {w: fresh(1, 2) for w in TOY_NOUNS + TOY_VERBS + TOY_ADJS + ["the"]}
    return World(countries=countries, lexicon=lexicon)


# --------------------------------------------------------------------------- domains
# Each domain returns a list of (user, assistant) turns; the first user turn
# states the task, later ones follow up on it.

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


# --------------------------------------------------------------------------- corpus


class SyntheticCorpusConfig(ConfigModel):
    """The synthetic corpus as a config section (`corpus.synthetic`) and as a call argument."""

    num_conversations: int = Field(gt=0)
    seed: int = 0
    # Share of conversations with more than one assistant turn.
    multi_turn_fraction: float = Field(0.3, ge=0.0, le=1.0)
    # Restrict to some domains; empty: all, round-robin so every domain gets its share.
    domains: tuple[str, ...] = ()

    @field_validator("domains")
    @classmethod
    def _known_domains(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        unknown = sorted(set(value) - set(DOMAINS))
        if unknown:
            raise ValueError(f"unknown domains {unknown}; known: {sorted(DOMAINS)}")
        return value


def conversation_id(messages: list[Message]) -> str:
    """Content hash of a conversation (stable across runs and machines)."""
    payload = json.dumps(messages, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(payload.encode()).hexdigest()[:24]


def generate(spec: SyntheticCorpusConfig) -> Iterator[Conversation]:
    """Yield conversations `{"id", "domain", "messages"}` in a deterministic order."""
    domains = list(spec.domains or DOMAINS)
    for index in range(spec.num_conversations):
        # One RNG per conversation: conversation i is the same whatever N is.
        rng = random.Random(f"{spec.seed}:{index}")
        domain = domains[index % len(domains)]
        num_turns = rng.randint(2, 3) if rng.random() < spec.multi_turn_fraction else 1
        messages: list[Message] = []
        if rng.random() < 0.4:
            messages.append({"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
        for user, assistant in DOMAINS[domain](rng, num_turns):
            messages.append({"role": "user", "content": user})
            messages.append({"role": "assistant", "content": assistant})
        yield {"id": conversation_id(messages), "domain": domain, "messages": messages}


def write_corpus(spec: SyntheticCorpusConfig, out_dir: str | Path) -> list[Path]:
    """Write `corpus.jsonl` and `corpus.parquet` (same rows) into `out_dir`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = list(generate(spec))
    jsonl = out / "corpus.jsonl"
    tmp = jsonl.with_suffix(".jsonl.tmp")
    with tmp.open("w") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    tmp.replace(jsonl)
    message = pa.struct([("role", pa.string()), ("content", pa.string())])
    schema = pa.schema(
        [("id", pa.string()), ("domain", pa.string()), ("messages", pa.list_(message))]
    )
    table = pa.Table.from_pylist(rows, schema=schema).replace_schema_metadata(
        {
            "dspark.corpus": json.dumps(
                {
                    "generator": "synthetic",
                    "seed": spec.seed,
                    "num_conversations": spec.num_conversations,
                }
            )
        }
    )
    parquet = out / "corpus.parquet"
    pq.write_table(table, parquet.with_suffix(".parquet.tmp"), compression="zstd")
    parquet.with_suffix(".parquet.tmp").replace(parquet)
    return [jsonl, parquet]
