"""The draft sources for draft-and-verify (:mod:`.drafts`: prompt lookup before and after
the cursor, analogy, typeahead), the "continue by analogy" rules (:mod:`.analogy`) and edit
distance and similarity (:mod:`.similarity`). Imports no other sub-package."""
