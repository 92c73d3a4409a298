"""Buffer + cursor -> post-processed suggestions: the completer (:mod:`.completer`, over the
backends, the draft sources and the text side) and the user-facing options it takes
(:mod:`.options`)."""
