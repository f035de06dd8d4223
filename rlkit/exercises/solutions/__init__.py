"""The instructor's side of the exercises: reference solutions, known mistakes and their cases.

``rlkit/exercises/solutions/chNN.py`` declares each exercise of chapter NN: the reference
solution (decorated with :func:`rlkit.exercises.exercise`), the cases it is checked on, and the
known wrong variants (decorated with :func:`rlkit.exercises.mistake`). The student bundle
(``python -m rlkit.exercises student-bundle``) leaves this folder out.
"""
