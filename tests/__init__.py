"""refgrid's tests, by room: a folder per package of src/refgrid (or top-level module), and
acceptance/, reliability/ and support/ (docs/design.md, "Tests by room")."""
