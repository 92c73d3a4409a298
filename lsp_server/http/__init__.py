"""The OpenAI-compatible HTTP server (:mod:`.http_server`: the front and the request path
every route shares), its connection layer (:mod:`.http_connection`: limits, connections,
the token, the access log, the listener), its routes (:mod:`.http_openai`: the completions;
:mod:`.http_status`: health and models; :mod:`.llama_infill`: llama.cpp's ``/infill``), its
wire types (:mod:`.http_wire`) and admission by predicted cost (:mod:`.http_cost`). All but
:mod:`.http_cost` need aiohttp."""
