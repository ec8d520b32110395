from django.db import models


class Note(models.Model):
    body = models.TextField()
    created = models.DateTimeField(auto_now_add=True)
