"""The Wordle environment's server side: the word lists and the game."""
