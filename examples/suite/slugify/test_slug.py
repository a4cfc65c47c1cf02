import unittest

from slug import slugify


class SlugifyTest(unittest.TestCase):
    def test_punctuation_and_case(self):
        self.assertEqual(slugify("Hello, World!"), "hello-world")

    def test_numbers_stay(self):
        self.assertEqual(slugify("Top 10 Tips"), "top-10-tips")

    def test_nothing_left(self):
        self.assertEqual(slugify("!!!"), "")


if __name__ == "__main__":
    unittest.main()
