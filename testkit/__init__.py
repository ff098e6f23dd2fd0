"""What tests/, local/, chaos/ and bench/ share: written once, used by all."""
