"""The draft sources for draft-and-verify (:mod:`.drafts`: the sources in their order, analogy,
typeahead; :mod:`.lookup`: prompt lookup before and after the cursor; :mod:`.query`: what every
source shares), the "continue by analogy" rules (:mod:`.analogy`) and edit
distance and similarity (:mod:`.similarity`). Imports no other sub-package."""
