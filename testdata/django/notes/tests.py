from django.db import connection
from django.test import TestCase

from .models import Note


class NoteTests(TestCase):
    def test_write_and_read(self):
        # The runner has switched to its own database on the same server.
        with connection.cursor() as cur:
            cur.execute("select current_database()")
            self.assertEqual(cur.fetchone()[0], connection.settings_dict["NAME"])
        self.assertTrue(connection.settings_dict["NAME"].startswith("test_"))

        Note.objects.create(body="written by the Django test runner")
        self.assertEqual(
            list(Note.objects.values_list("body", flat=True)),
            ["written by the Django test runner"],
        )
