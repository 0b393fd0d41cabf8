"""Generate the GSM8K-format sample shipped with verl-ascend (``train.jsonl``, ``test.jsonl``).

The problems are templated grade-school word problems written for this project (GSM8K itself cannot be
downloaded here). Each row has GSM8K's schema: ``question`` and ``answer``, the answer being step-by-step
reasoning with ``<<a op b=c>>`` calculator annotations and a final ``#### <number>`` line.

Regenerate (deterministic) with ``python verl/data/gsm8k_sample/make_sample.py``; a test checks that the shipped
files equal this script's output.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Callable

NAMES = ["Ava", "Ben", "Chloe", "Dan", "Ella", "Finn", "Grace", "Hugo", "Isla", "Jack", "Lena", "Omar", "Priya", "Sam"]
FRUITS = ["apples", "oranges", "pears", "plums", "lemons", "peaches"]
ITEMS = [("notebook", "notebooks"), ("pencil", "pencils"), ("sticker", "stickers"), ("marble", "marbles")]
SEEDS = {"train": 1234, "test": 5678}
SIZES = {"train": 64, "test": 16}


def buy_and_give(rng: random.Random) -> tuple[str, str]:
    name, fruit = rng.choice(NAMES), rng.choice(FRUITS)
    a, b = rng.randint(5, 40), rng.randint(3, 30)
    c = rng.randint(1, a + b - 1)
    s, r = a + b, a + b - c
    question = (
        f"{name} has {a} {fruit}. {name} buys {b} more {fruit} at the market and then gives {c} {fruit} to a "
        f"neighbour. How many {fruit} does {name} have now?"
    )
    answer = (
        f"After buying, {name} has {a} + {b} = <<{a}+{b}={s}>>{s} {fruit}.\n"
        f"After giving {c} away, {name} has {s} - {c} = <<{s}-{c}={r}>>{r} {fruit}.\n#### {r}"
    )
    return question, answer


def change_from_bill(rng: random.Random) -> tuple[str, str]:
    name, (one, many) = rng.choice(NAMES), rng.choice(ITEMS)
    price, count = rng.randint(2, 9), rng.randint(2, 6)
    cost = price * count
    bill = 50 if cost < 50 else 100
    change = bill - cost
    question = (
        f"A {one} costs ${price}. {name} buys {count} {many} and pays with a ${bill} bill. How many dollars of "
        f"change does {name} get?"
    )
    answer = (
        f"The {many} cost {count} * {price} = <<{count}*{price}={cost}>>{cost} dollars.\n"
        f"The change is {bill} - {cost} = <<{bill}-{cost}={change}>>{change} dollars.\n#### {change}"
    )
    return question, answer


def garden_rows(rng: random.Random) -> tuple[str, str]:
    name = rng.choice(NAMES)
    rows, per_row, per_plant = rng.randint(2, 9), rng.randint(3, 12), rng.randint(2, 8)
    plants, total = rows * per_row, rows * per_row * per_plant
    question = (
        f"{name} plants {rows} rows of tomato plants with {per_row} plants in each row. Each plant grows "
        f"{per_plant} tomatoes. How many tomatoes does {name} harvest?"
    )
    answer = (
        f"There are {rows} * {per_row} = <<{rows}*{per_row}={plants}>>{plants} plants.\n"
        f"They grow {plants} * {per_plant} = <<{plants}*{per_plant}={total}>>{total} tomatoes.\n#### {total}"
    )
    return question, answer


def weekly_savings(rng: random.Random) -> tuple[str, str]:
    name = rng.choice(NAMES)
    per_week, weeks, start = rng.randint(3, 15), rng.randint(3, 12), rng.randint(0, 20)
    saved = per_week * weeks
    goal = start + saved
    question = (
        f"{name} already has ${start} and saves ${per_week} every week. How many weeks does it take {name} to "
        f"have ${goal} for a new bike?"
    )
    answer = (
        f"{name} still needs {goal} - {start} = <<{goal}-{start}={saved}>>{saved} dollars.\n"
        f"At {per_week} dollars a week that takes {saved} / {per_week} = <<{saved}/{per_week}={weeks}>>{weeks} "
        f"weeks.\n#### {weeks}"
    )
    return question, answer


def class_fraction(rng: random.Random) -> tuple[str, str]:
    denominator, word = rng.choice([(2, "half"), (3, "a third"), (4, "a quarter"), (5, "a fifth")])
    students = denominator * rng.randint(4, 9)
    walkers = students // denominator
    rest = students - walkers
    bus = rng.randint(1, rest - 1)
    bikes = rest - bus
    question = (
        f"A class has {students} students. {word.capitalize()} of them walk to school, {bus} take the bus and "
        f"the rest ride bikes. How many students ride bikes?"
    )
    answer = (
        f"{students} / {denominator} = <<{students}/{denominator}={walkers}>>{walkers} students walk.\n"
        f"That leaves {students} - {walkers} = <<{students}-{walkers}={rest}>>{rest} students.\n"
        f"So {rest} - {bus} = <<{rest}-{bus}={bikes}>>{bikes} ride bikes.\n#### {bikes}"
    )
    return question, answer


def train_distance(rng: random.Random) -> tuple[str, str]:
    speed, hours, extra = rng.randint(30, 90), rng.randint(2, 6), rng.randint(10, 60)
    first = speed * hours
    total = first + extra
    question = (
        f"A train travels at {speed} miles per hour for {hours} hours, then another {extra} miles to reach the "
        f"station. How many miles does it travel in total?"
    )
    answer = (
        f"In {hours} hours it travels {speed} * {hours} = <<{speed}*{hours}={first}>>{first} miles.\n"
        f"In total it travels {first} + {extra} = <<{first}+{extra}={total}>>{total} miles.\n#### {total}"
    )
    return question, answer


TEMPLATES: list[Callable[[random.Random], tuple[str, str]]] = [
    buy_and_give,
    change_from_bill,
    garden_rows,
    weekly_savings,
    class_fraction,
    train_distance,
]


def make_split(split: str, exclude: set[str] = frozenset()) -> list[dict]:
    """``SIZES[split]`` distinct problems, cycling through the templates, none of whose questions is in ``exclude``."""
    rng = random.Random(SEEDS[split])
    rows, seen = [], set(exclude)
    while len(rows) < SIZES[split]:
        question, answer = TEMPLATES[len(rows) % len(TEMPLATES)](rng)
        if question not in seen:
            seen.add(question)
            rows.append({"question": question, "answer": answer})
    return rows


def make_sample() -> dict[str, list[dict]]:
    """Both splits; test questions never appear in train."""
    train = make_split("train")
    return {"train": train, "test": make_split("test", exclude={row["question"] for row in train})}


def main() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    for split, rows in make_sample().items():
        with open(os.path.join(here, f"{split}.jsonl"), "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
