"""What the user sees and measures: console, live line, progress, logs, metrics, time to recover."""
