"""The ORL trainer and demo: capture, replay, the decoder sweep and its plots."""
