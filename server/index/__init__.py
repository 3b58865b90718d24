"""The support app's index of typed documents (seed 000): conversations, knowledge
articles and trusted responses with JSON metadata.

- dwsearch.index.filter  the metadata filter expression language: parse, compile to
                         Postgres jsonb SQL, evaluate in Python
"""
