"""The tasks a comparison trains and scores on, each a source of prompts with numeric answers:
DeepMind's Mathematics questions (generated), arithmetic word problems, rJokes' scores and a
user's JSON Lines."""
