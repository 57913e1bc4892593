"""Booking bounded context: salons, resources, slots and soft holds that never double-book."""
