"""Text utilities shared by every step that counts words, lines or paragraphs."""
