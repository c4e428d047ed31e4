"""`runner report`: a run read back from its run dir(s) (story.py) and drawn as one HTML page (page.py)."""
