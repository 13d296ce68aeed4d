"""Settings for every test under tests/."""

from hypothesis import settings

# no example is failed for taking long: the tests assert behaviour, never speed, and they
# share the machine's cores with the control plane build (`make test` overlaps the two)
settings.register_profile("nexus", deadline=None)
settings.load_profile("nexus")
