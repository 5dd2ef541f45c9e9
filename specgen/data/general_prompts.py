"""General-purpose prompts (advice, explanations, summaries, translation, arithmetic, questions over a passage) made
from templates, the stdlib's module docs and scikit-learn's dataset descriptions: the n-gram cache's non-code half.

None of them is a benchmark's text (nor the shipped mixed set's: `tests/data/test_prompts.py` checks). The
same list on every machine with the same Python: a fixed seed, the interpreter's own docs.
"""

from __future__ import annotations

import hashlib
import importlib
import random
from functools import lru_cache

# the benchmark set's wording stays out: these topics and templates are this module's own
ACTIVITIES = ("learn to play the guitar", "keep a vegetable garden", "save money on groceries", "write a cover letter",
              "sleep better", "learn a second language", "organize a small closet", "prepare for a job interview",
              "train a puppy", "start a book club", "bake bread at home", "plan a camping trip", "keep a journal",
              "stay focused while studying", "paint a room", "host a board game night", "cook for one person",
              "learn to swim as an adult", "reduce screen time", "make a monthly budget", "fix a squeaky door",
              "choose a first bicycle", "get better at public speaking", "grow herbs on a windowsill",
              "prepare a healthy lunch for work", "teach a child to ride a bike", "make new friends at work",
              "stop procrastinating", "learn to draw", "pack for a week-long trip", "care for a cat",
              "keep a small apartment tidy", "learn to cook rice", "run a five-kilometre race",
              "write a thank-you note", "plan a birthday party", "start meditating", "declutter a kitchen",
              "learn basic first aid", "improve my handwriting")
CONCEPTS = ("photosynthesis", "inflation", "the water cycle", "gravity", "a vaccine", "an earthquake", "a black hole",
            "compound interest", "the immune system", "a rainbow", "electric current", "the greenhouse effect",
            "plate tectonics", "a democracy", "supply and demand", "evolution by natural selection", "an atom",
            "the tides", "a solar eclipse", "recycling", "a credit score", "the seasons", "a volcano", "DNA",
            "a thunderstorm", "the internet", "a battery", "sound waves", "erosion", "a calendar year",
            "a glacier", "friction", "a food chain", "the moon's phases", "a microscope", "a budget deficit",
            "a hurricane", "the heart", "a magnet", "a fossil", "the printing press", "an ecosystem", "a bank loan",
            "carbon dating", "the metric system", "a coral reef", "a telescope", "digestion", "wind power",
            "a migration of birds", "the stock market", "a fever", "a bridge", "nuclear energy", "a desert",
            "the Roman Empire", "a library", "a recipe", "a map", "a satellite")
ASKS = ("Explain {c} in simple terms.", "What is {c}? Give an example.", "How would you describe {c} to a child?",
        "Why is {c} important?", "Give me three facts about {c}.", "What are common misconceptions about {c}?")
WRITE = ("Write a short poem about {c}.", "Write a friendly email to a colleague about {c}.",
         "Write a two-paragraph story that involves {c}.")
ADVICE = ("How can I {a}?", "What are some tips to {a}?", "I want to {a}. Where should I start?",
          "Give me a short step-by-step plan to {a}.")
LANGUAGES = ("French", "Spanish", "German", "Italian", "Portuguese")
SUBJECTS = ("My brother", "The teacher", "Our neighbour", "The little dog", "My best friend", "The old man",
            "The children", "My aunt", "The new doctor", "Our team")
ACTIONS = ("walks to the market every morning", "forgot the keys at home", "is reading a long book",
           "bought fresh bread and cheese", "will visit the museum on Sunday", "likes to drink tea in the garden",
           "is cooking soup for everyone", "missed the last bus yesterday", "has painted the kitchen blue",
           "wants to learn how to dance")
TRANSLATE = ('Translate into {l}: "{s} {v}."', 'How do you say "{s} {v}" in {l}?')
SUMMARIZE = ("Summarize the following text in two sentences.\n\n{p}", "Give a short summary of this passage.\n\n{p}",
             "What are the main points of the text below?\n\n{p}")
READ = ("Read the passage and answer the question.\n\nPassage: {p}\n\nQuestion: What is this passage about, and what "
        "is one detail it mentions?",)
MODULES = ("textwrap heapq bisect json csv difflib fractions decimal statistics random calendar datetime string re "
           "pickle zipfile tarfile logging argparse shutil tempfile queue threading asyncio email hashlib hmac base64 "
           "contextlib dataclasses enum functools itertools operator collections typing abc").split()
DATASETS = ("load_iris", "load_wine", "load_breast_cancer", "load_diabetes", "load_digits", "load_linnerud")


def math_prompt(rng: random.Random) -> str:
    """An arithmetic word problem with fresh numbers."""
    a, b, c = rng.randint(3, 40), rng.randint(2, 12), rng.randint(10, 90)
    return rng.choice((
        f"A box holds {a} apples. How many apples are in {b} boxes? Show your work.",
        f"Tom has {a * b} marbles and shares them equally among {b} friends. How many does each friend get?",
        f"What is {c}% of {a * 10}? Explain how you computed it.",
        f"Solve for y: {b}y + {a} = {a + b * c}. Show each step.",
        f"A car drives {a * b} km in {b} hours. What is its average speed?",
        f"A square has a side of {a} cm. What are its perimeter and its area?",
    ))


def passages() -> list[str]:
    """Prose paragraphs of 200-1500 characters from the stdlib's module docs and scikit-learn's dataset descriptions."""
    from sklearn import datasets  # ~1 s of imports: only when the cache builder asks for the prompts

    texts = []
    for name in MODULES:
        try:
            texts.append(importlib.import_module(name).__doc__ or "")
        except ImportError:  # a module this build lacks
            continue
    texts += [getattr(datasets, name)().DESCR for name in DATASETS]
    paras = (" ".join(p.split()) for t in texts for p in t.split("\n\n"))
    return [p for p in paras if 200 <= len(p) <= 1500 and p[0].isupper() and p.endswith(".")
            and not any(mark in p for mark in (">>>", "==", " -- "))]  # prose: no examples, tables or lists


@lru_cache(maxsize=1)
def _build() -> tuple[str, ...]:
    rng = random.Random(0)
    out = [t.format(c=c) for c in CONCEPTS for t in ASKS]
    out += [rng.choice(WRITE).format(c=c) for c in CONCEPTS]
    out += [t.format(a=a) for a in ACTIVITIES for t in ADVICE]
    out += [rng.choice(TRANSLATE).format(l=rng.choice(LANGUAGES), s=s, v=v) for s in SUBJECTS for v in ACTIONS]
    out += [math_prompt(rng) for _ in range(160)]
    for p in passages():
        out += [rng.choice(SUMMARIZE).format(p=p), rng.choice(READ).format(p=p)]
    out = list(dict.fromkeys(out))  # a math problem may come up twice
    rng.shuffle(out)
    return tuple(out)


def general_prompts(limit: int | None = None) -> list[str]:
    """The prompts in their fixed order, the first `limit` of them."""
    return list(_build()[:limit])


def general_fingerprint() -> str:
    """A short hash of the whole list: what a cache built from it records."""
    return hashlib.sha256("\n\x00".join(_build()).encode()).hexdigest()[:12]
