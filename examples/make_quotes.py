"""Write examples/quotes.txt: sentences whose words are marked [in] inside a quotation and
[out] outside it, for `tinygpt probe --labels examples/quotes.txt`. The same clauses are used
in both places, so a word's identity does not tell which side it is on; only its context
does. Run from the repository root: python3 examples/make_quotes.py
"""

import random

NAMES = ["Lily", "Tom", "Sue", "Ben", "Mia", "Max", "Mom", "Dad"]
SAYS = ["said", "asked", "shouted", "told her friend"]
CLAUSES = ["the dog is big", "I like the red ball", "we can play in the park",
           "the cat ran away", "it is a sunny day", "my toy is lost", "she wants to go home",
           "the bird can sing", "he found a shiny stone", "the cake is very good",
           "they saw a little fish", "the tree is tall", "you can help me",
           "the boat is in the water", "we will go to the beach", "the box is heavy"]


def marked(clause: str, label: str, capital: bool) -> str:
    words = clause.split()
    if capital:
        words[0] = words[0][0].upper() + words[0][1:]
    return " ".join(f"{w}[{label}]" for w in words)


def line(rng: random.Random) -> str:
    name, says = rng.choice(NAMES), rng.choice(SAYS)
    told, quoted = rng.sample(CLAUSES, 2)
    speaker = f"{name}[out] " + " ".join(f"{w}[out]" for w in says.split())
    quote = f'"{marked(quoted, "in", True)}."'
    if rng.random() < 0.5:
        return f"{marked(told, 'out', True)}. {speaker}, {quote}"
    return f"{speaker}, {quote} Then {marked(told, 'out', False)}."


if __name__ == "__main__":
    rng = random.Random(0)
    with open("examples/quotes.txt", "w", encoding="utf-8") as f:
        for _ in range(200):
            f.write(line(rng) + "\n")
