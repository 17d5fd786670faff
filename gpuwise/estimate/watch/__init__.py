"""Am I using it well? A watched job's log summarised, judged, and its energy split. Pure."""
