"""Every service's settings class: the PERISCOPE_* variables each one reads, its defaults and its checks.

One module per service (probe, watcher, joiner, api, replay); `engine` holds the attribution knobs the
joiner and replay share (so one environment gives both the same outputs) and the idle rule the API
judges by. They live in the library, not in the applications, because more than the application reads
them: `periscope up` builds each child's settings with them (periscope.config.env_for), and
docs/settings.md is generated from them (periscope.settings.docs).
"""
