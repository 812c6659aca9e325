"""The preset: the YAML file that describes a run. schema (the validated model, load and save), yaml_io (safe
reading), roundtrip (saving with the user's comments kept), lenient (opening a file with unknown keys), shipped
(where the presets that come with the tool are)."""
