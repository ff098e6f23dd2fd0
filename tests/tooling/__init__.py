"""The tooling's tests (README.md)."""

# Set in the core's own project (template_copies.on_the_cores_own_application), where the modules that run the
# registered application go on as written; a checkout runs each of them there by one test.
ON_THE_CORES_OWN = "ON_THE_CORES_OWN_APPLICATION"
