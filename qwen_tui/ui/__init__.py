"""The wizard: the Textual App, its screens and widgets. Draws the wizard's model (qwen_tui.wizard) and acts
through the launch API (qwen_tui.run.api)."""
