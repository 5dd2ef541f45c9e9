"""Text generation: loading a text target and running a method over prompts."""
