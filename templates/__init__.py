"""The Jinja2 templates the deploy renders, shipped as package data (`sparkfleet.templates`, see pyproject.toml)."""
