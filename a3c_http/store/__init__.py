"""The run folder: what a master persists and resumes from, and who owns the folder."""
