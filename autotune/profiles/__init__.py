"""What a person takes away from a study: launch profiles, their verification, the report.

- :mod:`~autotune.profiles.export`: the profile of a stored study's best trial, with provenance.
- :mod:`~autotune.profiles.formats`: a profile as data and as ``sh``/``env``/``yaml``/``json`` text,
  built from its command line (:mod:`~autotune.profiles.command`), its measurement
  (:mod:`~autotune.profiles.measurement`) and its memory back-off (:mod:`~autotune.profiles.memory`).
- :mod:`~autotune.profiles.verify`: launch a profile and measure it again.
- :mod:`~autotune.profiles.writing`: the modes a profile or a report is written with.
- :mod:`~autotune.profiles.report`: the HTML report (``templates/report.html.j2``) and its
  charts (:mod:`~autotune.profiles.report_figures`).
"""
