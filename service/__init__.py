"""``tidelog serve``: the topics service over HTTP (spec/SERVICE.md)."""
