"""The OpenAI-compatible HTTP server (:mod:`.http_server`), its wire types
(:mod:`.http_wire`), admission by predicted cost (:mod:`.http_cost`) and llama.cpp's
``/infill`` route (:mod:`.llama_infill`). :mod:`.http_server` needs aiohttp."""
