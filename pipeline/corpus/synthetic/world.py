"""The fixed fictional world of the synthetic corpus: countries, names, the toy language.

Derived from a fixed world seed, so facts stay the same across corpus seeds
and a held-out corpus (another seed) asks about the same world.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from functools import lru_cache

WORLD_SEED = 20261130


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
