"""Random JSON schemas for the structured-output tests: nested objects, arrays, enums, bounded numbers, required
and optional keys. Every value is bounded (string lengths, array sizes, closed objects), so that a random-weights
model, which picks among the allowed tokens at random, finishes a valid value within a few dozen tokens."""
import numpy as np

WORDS = ["id", "name", "kind", "level", "items", "on", "room", "speed", "x", "y", "mode", "tags", "count", "ok", "unit", "pose"]

def leaf(rng: np.random.Generator) -> dict:
  k = rng.integers(7)
  if k == 0: return {"type": "string", "maxLength": int(rng.integers(1, 7)), **({"minLength": 1} if rng.random() < 0.5 else {})}
  if k == 1: return {"enum": list(rng.choice(["red", "green", "blue", "off", "auto", "eco"], int(rng.integers(2, 5)), replace=False))}
  if k == 2:
    lo = int(rng.integers(-50, 50))
    return {"type": "integer", "minimum": lo, "maximum": lo + int(rng.integers(0, 1000))}
  if k == 3:
    # multipleOf bounds the fraction's digits: a random-weights model with a tied embedding repeats digit tokens
    # once it has written one, and llguidance's JSON numbers, unlike llama.cpp's, allow any number of digits
    lo = float(rng.integers(-100, 100)) / 4
    return {"type": "number", "minimum": lo, "maximum": lo + float(rng.integers(1, 40)), "multipleOf": 0.25}
  if k == 4: return {"type": "boolean"}
  if k == 5: return {"enum": [int(v) for v in rng.choice(100, int(rng.integers(2, 4)), replace=False)]}
  return {"type": ["integer", "null"], "minimum": 0, "maximum": 9}

def value(rng: np.random.Generator, depth: int) -> dict:
  r = rng.random()
  if depth > 0 and r < 0.25: return obj(rng, depth - 1)
  if depth > 0 and r < 0.45:
    return {"type": "array", "items": value(rng, depth - 1), "minItems": int(rng.integers(0, 2)), "maxItems": int(rng.integers(2, 4))}
  return leaf(rng)

def obj(rng: np.random.Generator, depth: int) -> dict:
  names = list(rng.choice(WORDS, int(rng.integers(1, 5)), replace=False))
  required = [n for n in names if rng.random() < 0.6]
  return {"type": "object", "properties": {str(n): value(rng, depth) for n in names}, "required": [str(n) for n in required],
          "additionalProperties": False}

def schema(rng: np.random.Generator) -> dict: return obj(rng, 2)
