"""What a number is, in tokens (the vocabulary's number tokens, spans of them) and in text."""
